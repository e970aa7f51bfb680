"""The fork server (issue 5): runs of the default environment forked from a pre-initialised
interpreter, each in a fresh sandbox of its own.

A forked run must be as isolated as a cold one and look the same to the script: its own
namespaces (pid 1 is its own init, it is pid 2), uid 65534 inside and the fork server's host
uid outside (in a user namespace of its own), no capabilities, no_new_privs, seccomp, loopback only, a fresh /proc, /tmp and /work,
nothing of another run (files, variables, processes), no view of the server's run
directories; limits, timeouts and signals behave as in a cold run. Each test checks through
the `forked` counter that the run really was forked."""

from __future__ import annotations

import json
import os
import subprocess
import time
import uuid

import anyio
import pytest

from attacks_support import ProcWatch, cgroup_leftovers
from backend_support import FORK_SERVER_ONLY
from conftest import call, connect, have_bwrap
from host_support import cgroup_members
from test_builds import compilation
from test_pool import outlives_its_timeout, runs_share_nothing

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.native_only(FORK_SERVER_ONLY),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

LEASED = range(200_000, 200_000 + 4096)


async def pool_state(client) -> dict:
    report, _, _ = await call(client, "check_environment")
    return report["warm_pool"]


async def wait_forking(client, seconds: float = 30.0) -> dict:
    """Name the default environment (cache warming is off in this suite), then wait until
    the fork server serves it."""
    data, _, _ = await call(client, "execute_python", script="print('warm')")
    assert data["status"] == "ok", data
    deadline = time.monotonic() + seconds
    while True:
        state = await pool_state(client)
        if state["fork_servers"] >= 1:
            return state
        assert state["fork_server_error"] is None, state
        assert time.monotonic() < deadline, f"the fork server did not start: {state}"
        await anyio.sleep(0.1)


async def compiled_now(client) -> None:
    """Wait until no environment is being compiled in the background: the fork server of an
    environment just built gives way to one of its compiled copy when that is published, and
    a run that comes just then may start cold."""
    deadline = time.monotonic() + 240
    while (await compilation(client))["pending"]:
        assert time.monotonic() < deadline, await compilation(client)
        await anyio.sleep(0.2)


async def built(client, dependencies: list[str]) -> None:
    """Build the environment of `dependencies` with one run, and wait until its background
    compilation is done (see `compiled_now`)."""
    first, _, _ = await call(client, "execute_python", script="pass", dependencies=dependencies, timeout_seconds=300)
    assert first["status"] == "ok", first
    await compiled_now(client)


async def fork_server_with(client, *modules: str) -> dict:
    """Wait until a fork server has preloaded all of `modules`; what check_environment says
    of it."""
    deadline = time.monotonic() + 120
    while True:
        state = await pool_state(client)
        details = [d for d in state["fork_server_details"] if all(m in d["preloaded"] for m in modules)]
        if details:
            return details[0]
        assert state["fork_server_error"] is None, state
        assert time.monotonic() < deadline, (modules, state)
        await anyio.sleep(0.2)


async def forked_run(client, script: str, **arguments) -> dict:
    """Run `script` and check that the fork server ran it."""
    before = await pool_state(client)
    data, _, _ = await call(client, "execute_python", script=script, **arguments)
    after = await pool_state(client)
    assert after["forked"] == before["forked"] + 1, (before, after)
    return data


PROBE = r"""
import json, os, socket, errno, ctypes
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
libc = ctypes.CDLL(None, use_errno=True)
def err(result):
    return "ok" if result == 0 else errno.errorcode[ctypes.get_errno()]
mounted = err(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None))
unshared = err(libc.unshare(0x10000000))
def exists(path):
    return os.path.exists(path)
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(), "groups": os.getgroups(),
    "pid": os.getpid(), "ppid": os.getppid(),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
    "cap_eff": status["CapEff"].strip(), "cap_bnd": status["CapBnd"].strip(),
    "cap_prm": status["CapPrm"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    "hostname": socket.gethostname(),
    "interfaces": sorted(name for _, name in socket.if_nameindex()),
    "run_dirs_visible": exists("/run/snakebox/runs") and os.listdir("/run/snakebox/runs") != [],
    "mount": mounted, "unshare": unshared,
    "cwd": os.getcwd(),
    "proc_sys_writable": os.access("/proc/sys/kernel/hostname", os.W_OK),
    "oom_score_adj": open("/proc/self/oom_score_adj").read().strip(),
}))
"""


async def test_a_forked_run_is_a_fresh_sandbox(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        data = await forked_run(client, PROBE)
        assert data["status"] == "ok", data
        seen = json.loads(data["stdout"])
        assert (seen["uid"], seen["gid"]) == (65534, 65534), seen
        # Its own pid namespace: an init (pid 1) and the run (pid 2), nothing else.
        assert (seen["pid"], seen["ppid"]) == (2, 1), seen
        assert seen["pids"] == [1, 2], seen
        assert seen["cap_eff"] == seen["cap_bnd"] == seen["cap_prm"] == "0000000000000000", seen
        assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2", seen
        assert seen["hostname"] == "sandbox", seen
        assert seen["interfaces"] == ["lo"], seen
        assert seen["run_dirs_visible"] is False, seen
        assert seen["mount"] == "EPERM" and seen["unshare"] == "EPERM", seen
        assert seen["cwd"] == "/work", seen
        assert seen["proc_sys_writable"] is False, seen
        assert int(seen["oom_score_adj"]) >= 500, seen


INIT_PROBE = r"""
import errno, json, os
status = dict(line.split(":", 1) for line in open("/proc/1/status").read().splitlines() if ":" in line)
def attempt(fn):
    try:
        fn()
        return "ok"
    except OSError as e:
        return errno.errorcode[e.errno]
print(json.dumps({
    "cap_eff": status["CapEff"].strip(), "cap_prm": status["CapPrm"].strip(),
    "no_new_privs": status["NoNewPrivs"].strip(), "seccomp": status["Seccomp"].strip(),
    # Writing pid 1's memory (or reading its descriptors) would hijack it: it holds the
    # socket its run's end is reported on.
    "mem": attempt(lambda: os.close(os.open("/proc/1/mem", os.O_RDWR))),
    "fds": attempt(lambda: os.listdir("/proc/1/fd")),
    "own_fds": attempt(lambda: os.listdir("/proc/self/fd")),
}))
"""


async def test_a_forked_runs_init_holds_no_more_than_the_run_and_cannot_be_taken_over(snakebox_bin, data_dir):
    """Pid 1 of a forked run (a clone of the fork server that built the run's sandbox) gives
    up its capabilities, takes the run's seccomp programs and becomes not dumpable before a
    run reaches its pid 2: the run's code sees an init with nothing, and can neither write
    its memory nor see its descriptors (its own, it still can). Each way a run is forked:
    a child made for the run, and a pre-forked one."""
    for prefork in ("0", "2"):
        async with connect(snakebox_bin, data_dir, "legacy", "--prefork", prefork) as client:
            await wait_forking(client)
            # Several: a child made for its run gets it while its pid 1 may still be giving
            # things up (pid 2 must wait for that), which a single run may not catch.
            runs = [await forked_run(client, INIT_PROBE) for _ in range(8)]
        for data in runs:
            assert data["status"] == "ok", data
            seen = json.loads(data["stdout"])
            assert seen["cap_eff"] == seen["cap_prm"] == "0000000000000000", (prefork, seen)
            assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2", (prefork, seen)
            assert seen["mem"] in ("EACCES", "EPERM") and seen["fds"] in ("EACCES", "EPERM"), (prefork, seen)
            assert seen["own_fds"] == "ok", (prefork, seen)


FORKING_SCRIPT = r"""
import os, sys, time
child = os.fork()
if child == 0:
    print("child ends", flush=True)
    sys.exit(0)  # through the runner's end, as the script's own process would
os.waitpid(child, 0)
time.sleep(0.5)
print("the script went on")
sys.exit(3)
"""


async def test_a_process_the_script_forks_does_not_end_the_run_when_it_ends(snakebox_bin, data_dir):
    """Pid 1 reports the run's end as soon as the script's process says its exit code (while
    that process exits); a process the script forked ends through the same code and must not
    end the run: the script goes on after its child ended, and its own code is reported."""
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        data = await forked_run(client, FORKING_SCRIPT)
    assert data["stdout"] == "child ends\nthe script went on\n", data
    assert data["exit_code"] == 3 and data.get("signal") is None, data


SIGNALS_PID_1 = """
import os, signal, time
for name in ("SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGQUIT", "SIGKILL"):
    try:
        os.kill(1, getattr(signal, name))
    except OSError as e:
        print(name, "refused", e.errno)
time.sleep(0.3)
print("still running")
"""


async def test_signals_the_script_sends_its_pid_1_do_not_end_the_run(snakebox_bin, data_dir):
    """A forked run's pid 1 is its namespace's init: the kernel drops what the run sends it
    unless it handles the signal, so it must handle none (Python's own SIGINT handler would
    make it end, and the run with it, on the script's `kill(1, SIGINT)`)."""
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        data = await forked_run(client, SIGNALS_PID_1)
    assert data["status"] == "ok", data
    assert data["stdout"] == "still running\n", data


# Its `.pth` sleeps where its site-packages are writable: only while the environment is
# byte-compiled (runs and fork servers see it read-only), which then takes long enough for the
# fork server of the first, uncompiled directory to be serving when the compiled copy replaces it.
SLOW_COMPILE_BOOT = """
import os, time
if os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    time.sleep(6)
"""
# Whether the run imported the package from a compiled environment (its bytecode is there).
COMPILED_PROBE = "import os, snakebox_slow_compile as m\nprint(os.path.exists(m.__cached__))"


async def test_runs_are_forked_across_the_publish_of_an_environments_compiled_copy(
    snakebox_bin, data_dir, tmp_path_factory
):
    """A new environment is published before it is byte-compiled, and the compiled copy
    replaces it in the background. A fork server of the copy is started before the copy is
    published and takes over at once: every run is forked, from the first directory until the
    publish and from the compiled copy right after it (before, the runs after the publish
    started cold until a new fork server was ready)."""
    from test_caller_code import SimpleIndex, pack_wheel

    package = "snakebox-slow-compile"
    module = package.replace("-", "_")
    wheel = pack_wheel(
        tmp_path_factory.mktemp("slow-compile"),
        package,
        {
            f"{module}/__init__.py": b"VALUE = 1\n",
            f"_{module}_boot.py": SLOW_COMPILE_BOOT.encode(),
            f"{module}.pth": f"import _{module}_boot\n".encode(),
        },
    )
    index = SimpleIndex(wheel, package)
    deps = [f"{package}==1.0"]

    async def forked_probe(client) -> str:
        before = await pool_state(client)
        data, _, _ = await call(client, "execute_python", script=COMPILED_PROBE, dependencies=deps)
        after = await pool_state(client)
        assert data["status"] == "ok", data
        assert after["cold_starts"] == before["cold_starts"], (data["stdout"], before, after)
        assert after["forked"] == before["forked"] + 1, (data["stdout"], before, after)
        return data["stdout"]

    async def compiled(client) -> int:
        report, _, _ = await call(client, "check_environment")
        return report["cache"]["compilation"]["completed"]

    try:
        async with connect(snakebox_bin, data_dir, "legacy", env={"UV_INDEX_URL": index.url}) as client:
            data, _, _ = await call(client, "execute_python", script=COMPILED_PROBE, dependencies=deps, timeout_seconds=120)
            assert data["status"] == "ok" and data["stdout"] == "False\n", data  # published uncompiled
            with anyio.fail_after(60):
                while (await pool_state(client))["fork_servers"] < 1:
                    await anyio.sleep(0.1)
            assert await compiled(client) == 0, "compiled before its fork server served"
            # Until the publish: forked from the first directory (the last may already come
            # from the copy, published while it was on its way).
            seen = []
            with anyio.fail_after(120):
                while seen[-1:] != ["True\n"] and await compiled(client) == 0:
                    seen.append(await forked_probe(client))
                    await anyio.sleep(0.2)
            assert seen and set(seen[:-1]) <= {"False\n"}, seen
            # Right after it: forked from the compiled copy.
            for _ in range(3):
                assert await forked_probe(client) == "True\n"
            assert (await pool_state(client))["fork_servers"] == 1
    finally:
        index.close()


async def test_consecutive_forked_runs_share_nothing(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        await runs_share_nothing(lambda script: forked_run(client, script))


async def test_concurrent_forked_runs_have_their_own_user_namespaces_under_the_fork_servers_uid(snakebox_bin, data_dir):
    """Forked runs have the fork server's leased host uid (never root, never 65534), each in a
    user namespace of its own nested in the fork server's, which is not the host's."""
    marker = uuid.uuid4().hex[:10]
    # The marker is in a child's command line, where a host-side scan can find it.
    script = f"""
import subprocess, sys
subprocess.run([sys.executable, '-c', 'import time; time.sleep(3)  # {marker}-{{n}}'])
print('done')
"""

    def host_view() -> dict[int, tuple[int, str]]:
        found = {}
        for n in range(2):
            pids = subprocess.run(["pgrep", "-f", f"{marker}-{n}"], capture_output=True, text=True).stdout.split()
            for pid in pids:
                try:
                    status = open(f"/proc/{pid}/status").read()
                    userns = os.readlink(f"/proc/{pid}/ns/user")
                except OSError:
                    continue
                uid = next(line.split()[1] for line in status.splitlines() if line.startswith("Uid:"))
                found[n] = (int(uid), userns)
        return found

    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        before = await pool_state(client)
        results = {}

        async def run(n):
            results[n], _, _ = await call(client, "execute_python", script=script.replace("{n}", str(n)))

        seen = {}
        async with anyio.create_task_group() as group:
            group.start_soon(run, 0)
            group.start_soon(run, 1)
            deadline = time.monotonic() + 10
            while len(seen) < 2 and time.monotonic() < deadline:
                await anyio.sleep(0.1)
                seen.update(host_view())
        assert all(r["status"] == "ok" for r in results.values()), results
        after = await pool_state(client)
        assert after["forked"] == before["forked"] + 2, (before, after)
        assert len(seen) == 2, seen
        (uid0, ns0), (uid1, ns1) = seen[0], seen[1]
        assert uid0 == uid1 and uid0 in LEASED, seen
        assert ns0 != ns1, "two forked runs shared a user namespace"
        assert os.readlink("/proc/self/ns/user") not in (ns0, ns1)


async def test_a_forked_timeout_keeps_output_and_kills_the_tree(snakebox_bin, data_dir):
    marker = f"fork-tree-{uuid.uuid4().hex[:8]}"
    script = outlives_its_timeout(marker)
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        data = await forked_run(client, script, timeout_seconds=2)
        assert data["status"] == "timeout", data
        assert "before the timeout" in data["stdout"]
        deadline = time.monotonic() + 5
        while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "a process of the timed-out run survived"
            await anyio.sleep(0.1)
        # The fork server serves on.
        data = await forked_run(client, "print('after')")
        assert data["stdout"] == "after\n", data


async def test_forked_runs_keep_limits_signals_and_exit_codes(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--memory-limit", "128MiB") as client:
        await wait_forking(client)
        hog = await forked_run(client, "x = bytearray(512 * 1024 * 1024)\nprint(len(x))")
        assert hog["status"] == "memory_limit", hog
        term = await forked_run(client, "import os, signal\nprint('bye', flush=True)\nos.kill(os.getpid(), signal.SIGTERM)")
        assert term["status"] == "error" and term["signal"] == 15, term
        assert term["stdout"] == "bye\n", term
        code = await forked_run(client, "import sys\nsys.exit(3)")
        assert code["status"] == "error" and code["exit_code"] == 3, code
        value = await forked_run(client, "import atexit\natexit.register(lambda: print('at exit'))\nf = open('kept.txt', 'w')\nf.write('unclosed')\n21 * 2")
        assert value["status"] == "ok", value
        assert value["result"]["json"] == 42, value
        assert value["stdout"] == "at exit\n", value
        assert [a["name"] for a in value["artifacts"]] == ["kept.txt"], value
        assert [a["size"] for a in value["artifacts"]] == [len("unclosed")], value


async def test_fork_server_off_leaves_runs_to_the_pool(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--fork-server", "off") as client:
        for _ in range(3):
            data, _, _ = await call(client, "execute_python", script="print('pooled')")
            assert data["stdout"] == "pooled\n", data
        await anyio.sleep(1)
        state = await pool_state(client)
        assert state["fork_servers"] == 0 and state["forked"] == 0, state
        assert state["fork_server_error"] is None, state


async def test_a_recently_used_environment_gets_its_own_fork_server(snakebox_bin, data_dir):
    script = "import six\nprint(six.__version__)"
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        first, _, _ = await call(client, "execute_python", script=script, dependencies=["six==1.16.0"], timeout_seconds=120)
        assert first["status"] == "ok" and first["stdout"] == "1.16.0\n", first
        # The environment is compiled after its first run and published anew in its place: a
        # fork server of the directory it replaced is dropped when a run claims it (that run
        # starts cold) and one is started for the new directory; the next run is forked.
        deadline = time.monotonic() + 60
        while True:
            while (await pool_state(client))["fork_servers"] < 2:
                assert time.monotonic() < deadline, await pool_state(client)
                await anyio.sleep(0.1)
            before = await pool_state(client)
            again, _, _ = await call(client, "execute_python", script=script, dependencies=["six==1.16.0"])
            assert again["status"] == "ok" and again["stdout"] == "1.16.0\n", again
            if (await pool_state(client))["forked"] == before["forked"] + 1:
                break
            assert time.monotonic() < deadline, "no run of the environment was forked"
        # The default environment is still forked by its own server.
        plain = await forked_run(client, "import importlib.util\nprint(importlib.util.find_spec('six') is None)")
        assert plain["stdout"] == "True\n", plain


async def test_concurrent_forked_runs_do_not_see_each_others_terminals(snakebox_bin, data_dir):
    """Each forked run has a devpts instance of its own: a pty another run holds open is not
    in its /dev/pts (they share a host uid, so a shared instance would let one open the
    other's terminal)."""
    holder = "import os, time\nm, s = os.openpty()\nprint(os.ttyname(s), sorted(os.listdir('/dev/pts')), flush=True)\ntime.sleep(4)"
    looker = "import os\nprint(sorted(os.listdir('/dev/pts')))"
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        before = await pool_state(client)
        results = {}

        async def hold():
            results["holder"], _, _ = await call(client, "execute_python", script=holder)

        async with anyio.create_task_group() as group:
            group.start_soon(hold)
            await anyio.sleep(1.5)
            results["looker"], _, _ = await call(client, "execute_python", script=looker)
        after = await pool_state(client)
    assert after["forked"] == before["forked"] + 2, (before, after)
    held, look = results["holder"], results["looker"]
    assert held["status"] == "ok" and held["stdout"].startswith("/dev/pts/0 ['0', 'ptmx']"), held
    assert look["status"] == "ok" and look["stdout"] == "['ptmx']\n", look



PRELOAD_PROBE = r"""
import json, os, random, sys
preloaded = "numpy" in sys.modules
import numpy
seen = {
    "preloaded": preloaded,
    "probe": getattr(numpy, "snakebox_probe", "original"),
    "precision": numpy.get_printoptions()["precision"],
    "random": random.random(),
    "numpy_random": float(numpy.random.random()),
    "thread_vars": sorted(k for k in os.environ if k.endswith("_NUM_THREADS")),
    # The start-up environment /proc keeps (the fork server's, in a fork): nothing the run's
    # own environment does not have (what to preload is not passed there).
    "startup_env_extra": sorted(
        set(entry.split("=", 1)[0] for entry in open("/proc/self/environ").read().split("\0") if entry)
        - set(os.environ)
    ),
    # LAPACK through the preloaded library, in the forked run.
    "inverse": float(numpy.linalg.inv(numpy.eye(64) * 2.0).sum()),
}
# Module-level state a run changes in the preloaded package.
numpy.snakebox_probe = "changed by an earlier run"
numpy.set_printoptions(precision=2)
numpy.random.seed(1234)
print(json.dumps(seen))
"""


async def test_a_preloaded_package_is_fresh_in_every_forked_run(snakebox_bin, data_dir):
    """The fork server of an environment imports its declared packages before it forks runs
    (`--preload-packages`): a run finds numpy already imported, yet what one run changes in it
    (a module attribute, print options, the global generator's seed) is back to its original
    value in the next, each run draws its own random numbers, and LAPACK works in the fork.
    `check_environment` says what each fork server preloaded and what it costs."""
    dependencies = ["numpy"]
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        await built(client, dependencies)
        details = await fork_server_with(client, "numpy")
        memory = details["peak_memory_bytes"]
        assert memory is None or memory > 10 << 20, details  # an interpreter with numpy in it
        runs = []
        for _ in range(3):
            data = await forked_run(client, PRELOAD_PROBE, dependencies=dependencies)
            assert data["status"] == "ok", data
            runs.append(json.loads(data["stdout"]))
        for seen in runs:
            assert seen["preloaded"] is True, seen
            assert seen["probe"] == "original" and seen["precision"] == 8, seen
            assert seen["thread_vars"] == [], seen
            assert seen["startup_env_extra"] == [], seen
            assert seen["inverse"] == 32.0, seen
        assert len({seen["random"] for seen in runs}) == 3, runs
        assert len({seen["numpy_random"] for seen in runs}) == 3, runs



LEARN_PROBE = (
    "import sys\nfound = sorted(m for m in ('wave', 'colorsys', 'quopri') if m in sys.modules)\n"
    "import {}\nprint(found, getattr(colorsys, 'MINE', False) if 'colorsys' in dir() else None)\n"
)
OWN_COLORSYS = [{"path": "colorsys.py", "content": "MINE = True\n"}]


async def test_a_fork_server_imports_what_its_runs_imported(snakebox_bin, data_dir):
    """Besides its declared packages, the fork server of an environment imports what its runs
    imported: a module two runs imported is learned, the refill starts a fork server that
    imports it too and puts it in the old one's place, and the next run finds it loaded. A
    module one run imported is not learned, nor one a run imported from its own files (its
    `colorsys.py`, which shadows the standard library's); and a run's own file still shadows
    a module the fork server loaded (as in a cold run). The default environment's fork server
    (shared by every tenant: no packages) learns nothing."""
    dependencies = ["numpy"]
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        # The default environment: two runs import `wave`.
        for _ in range(2):
            data = await forked_run(client, LEARN_PROBE.format("wave"))
            assert data["status"] == "ok" and data["stdout"] == "[] None\n", data
        await built(client, dependencies)
        await fork_server_with(client, "numpy")
        # Two runs import `wave` and their own `colorsys`, one of them `quopri` too.
        for modules in ("wave, colorsys, quopri", "wave, colorsys"):
            data = await forked_run(client, LEARN_PROBE.format(modules), dependencies=dependencies, files=OWN_COLORSYS)
            assert data["status"] == "ok" and data["stdout"] == "[] True\n", data
        learned = await fork_server_with(client, "numpy", "wave")
        assert "colorsys" not in learned["preloaded"] and "quopri" not in learned["preloaded"], learned
        data = await forked_run(client, LEARN_PROBE.format("wave"), dependencies=dependencies)
        assert data["status"] == "ok" and data["stdout"] == "['wave'] None\n", data
        # A run with its own `wave.py` imports its own.
        own_wave = "import wave\nprint(getattr(wave, 'MINE', False))\n"
        data = await forked_run(client, own_wave, dependencies=dependencies, files=[{"path": "wave.py", "content": "MINE = True\n"}])
        assert data["status"] == "ok" and data["stdout"] == "True\n", data
        # The default environment's fork server learned nothing.
        state = await pool_state(client)
        default = [d for d in state["fork_server_details"] if "numpy" not in d["preloaded"]]
        assert default and all("wave" not in d["preloaded"] for d in default), state
        data = await forked_run(client, LEARN_PROBE.format("wave"))
        assert data["status"] == "ok" and data["stdout"] == "[] None\n", data

PYPLOT_SCRIPT = (
    "import sys\nfound = 'matplotlib.pyplot' in sys.modules\nimport matplotlib.pyplot as plt\n"
    "plt.plot([1, 2, 3], [1, 4, 9])\nplt.show()\nplt.plot([1, 2], [2, 1])\nprint(found)\n"
)


async def test_a_preloaded_pyplot_still_shows_figures_as_images(snakebox_bin, data_dir):
    """The fork server of an environment that declares matplotlib has pyplot loaded before
    any run (matplotlib's top-level `pylab` module imports it; a run that imports pyplot
    teaches it too): a forked run's `plt.show()` still captures and closes the figure, as in
    a cold run, so the plot after it is a second figure. (Before, a forked run's `show()` was
    matplotlib's own, and both plots ended up in one figure.)"""
    dependencies = ["matplotlib==3.10.3"]
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        await built(client, dependencies)
        await fork_server_with(client, "matplotlib")
        data = await forked_run(client, PYPLOT_SCRIPT, dependencies=dependencies)
    assert data["status"] == "ok" and data["stdout"] == "True\n", data
    figures = [a for a in data["artifacts"] if a["origin"] == "figure"]
    assert [f["name"] for f in figures] == ["figure-1.png", "figure-2.png"], data["artifacts"]

IMMORTAL_PROBE = r"""
import json, os, sys, weakref
# A function the fork server loaded, as the run finds it.
held = sys.getrefcount(os.path.join)
# The run's own objects count and are freed as ever.
class Mine:
    pass
mine, freed = Mine(), []
watch = weakref.ref(mine, lambda _: freed.append(True))
own = sys.getrefcount(mine)
del mine
# Dropping and putting back one of the fork server's objects works as it would anywhere.
dumps = json.dumps
del json.dumps
json.dumps = dumps
print(json.dumps({"held": held, "own": own, "freed": freed, "version": list(sys.version_info[:2]), "abiflags": sys.abiflags}))
"""


async def test_a_forked_run_finds_what_the_fork_server_holds_immortal(snakebox_bin, data_dir):
    """Before it forks, the fork server makes every object it holds immortal (PEP 683, CPython
    3.12 and 3.13): a run that uses one writes no reference count, so it copies no page of the
    fork server's memory for it. The run's own objects count and are freed as usual."""
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        data = await forked_run(client, IMMORTAL_PROBE)
    assert data["status"] == "ok", data
    seen = json.loads(data["stdout"])
    assert seen["own"] == 2 and seen["freed"] == [True], seen
    # The default interpreter of these machines is 3.13 (the only place the check can hold).
    assert tuple(seen["version"]) in {(3, 12), (3, 13)} and seen["abiflags"] == "", seen
    assert seen["held"] == (1 << 32) - 1, seen


# Two processes that take long to exit (each maps a large file of the interpreter many times:
# the kernel needs tens of milliseconds to tear down their page tables) and a chain of
# processes that never keeps a pid (each forks the next and ends), all carrying MARK in their
# command line. None holds the run's output (the reply would wait for that to end). The
# script ends while they run.
SLOW_TO_EXIT = r'''
import os, subprocess, sys, time
HOLD = """
import mmap, os, sys, time
maps, total = [], 0
with open(sys.argv[1], 'rb') as f:
    while total < (8 << 30) and len(maps) < 30000:
        maps.append(mmap.mmap(f.fileno(), 0, flags=mmap.MAP_PRIVATE | mmap.MAP_POPULATE, prot=mmap.PROT_READ))
        total += len(maps[-1])
open('/tmp/held-%d' % os.getpid(), 'w').close()
while True:
    time.sleep(0.01)
"""
CHAIN = """
import os
while True:
    if os.fork():
        os._exit(0)
"""
candidates = [os.path.realpath(sys.executable)]
lib = os.path.join(sys.base_prefix, "lib")
candidates += [os.path.join(lib, name) for name in os.listdir(lib)]
biggest = max((p for p in candidates if os.path.isfile(p)), key=os.path.getsize)
for _ in range(2):
    subprocess.Popen([sys.executable, "-c", HOLD, biggest, "MARK"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
subprocess.Popen([sys.executable, "-c", CHAIN, "MARK"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
deadline = time.monotonic() + 60
while len([n for n in os.listdir("/tmp") if n.startswith("held-")]) < 2 and time.monotonic() < deadline:
    time.sleep(0.05)
print("held", len([n for n in os.listdir("/tmp") if n.startswith("held-")]))
'''

PF_EXITING = 0x4


def dying(pid: int) -> bool | None:
    """Whether the process can never run code again: it is exiting or has SIGKILL pending
    (None: it is gone). Asked three times, a millisecond apart: the kernel takes SIGKILL off
    the pending set a moment before it marks the process exiting."""
    for _ in range(3):
        try:
            stat = open(f"/proc/{pid}/stat").read()
            status = dict(line.split(":\t", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":\t" in line)
        except (FileNotFoundError, ProcessLookupError):
            return None
        fields = stat.rsplit(") ", 1)[1].split()
        pending = int(status.get("SigPnd", "0"), 16) | int(status.get("ShdPnd", "0"), 16)
        if fields[0] in ("Z", "X") or int(fields[6]) & PF_EXITING or pending & (1 << (9 - 1)):
            return True
        time.sleep(0.001)
    return False


def run_cgroups(watch) -> set:
    return {d for d in watch.cgroups() if d.name.startswith("snakebox-")}


async def test_when_a_forked_run_returns_none_of_its_processes_can_run_code(snakebox_bin, data_dir):
    """The reply of a forked run does not wait for its processes' exits, but it comes only once
    none of them can run code again: the run's pid 1 SIGKILLs the rest of its pid namespace in
    one step that no fork slips past (even a chain of forks that never keeps a pid), then
    reports the end. Judged from the host right after the call returns: the processes that
    take long to exit are still there, and each is exiting or has SIGKILL pending. They are
    gone soon after, and the run's cgroups with them. (That no fork slips past the kill is the
    kernel's guarantee for kill(-1); from outside, a reply sent before the kill would look the
    same once pid 1's own exit, a millisecond later, had killed the namespace.)"""
    marker = f"slow-exit-{uuid.uuid4().hex[:8]}"
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        await wait_forking(client)
        before = await pool_state(client)
        with ProcWatch(marker, interval=0.02) as watch:
            data, _, _ = await call(client, "execute_python", script=SLOW_TO_EXIT.replace("MARK", marker), timeout_seconds=120)
            members = cgroup_members([str(d) for d in run_cgroups(watch)])
            left = {int(pid): dying(int(pid)) for text in members.values() for pid in text.split()}
        after = await pool_state(client)
    assert data["status"] == "ok" and data["stdout"] == "held 2\n", data
    assert after["forked"] == before["forked"] + 1, (before, after)
    assert run_cgroups(watch), f"the run's processes were never seen from the host: {watch.seen}"
    assert left, "every process of the run had exited before the call returned (the reply waited for the exits)"
    assert all(state is not False for state in left.values()), f"processes of the run still running after the reply: {left}"
    assert not cgroup_leftovers(run_cgroups(watch), grace=30), "the run's processes did not go"
