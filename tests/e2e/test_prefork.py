"""Pre-forked children (issue 19): each fork server keeps `--prefork N` children already
forked into a run's fresh sandbox (namespaces, cgroup, /tmp, /dev/shm, devpts, /proc,
loopback), waiting for a run, so that a call pays only for its code.

A run served by one must be exactly as fresh and as confined as any forked run: nothing of an
earlier run reaches it (files, /tmp, /dev/shm, variables, module state, processes), its pid
namespace holds only its init and itself, and it holds no more than a run. The children are
bounded by `--prefork`, reported by `check_environment`, replaced after each run, and gone
(processes and cgroups) when their fork server stops and when the server shuts down. Each
test counts from the report that its runs really were served by a pre-forked child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import anyio
import pytest

from conftest import call, connect, have_bwrap, server_pid
from test_forkserver import PROBE, pool_state
from test_pool import runs_share_nothing

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


async def wait_prefork(client, ready: int, seconds: float = 60.0) -> dict:
    """Name the default environment (cache warming is off in this suite), then wait until its
    fork server has `ready` pre-forked children waiting."""
    data, _, _ = await call(client, "execute_python", script="print('warm')")
    assert data["status"] == "ok", data
    deadline = time.monotonic() + seconds
    while True:
        state = await pool_state(client)
        details = state["fork_server_details"]
        if details and details[0]["prefork_ready"] >= ready:
            return state
        assert state["fork_server_error"] is None, state
        assert time.monotonic() < deadline, f"no {ready} pre-forked children: {state}"
        await anyio.sleep(0.1)


async def preforked_run(client, script: str, **arguments) -> dict:
    """Run `script` and check that a pre-forked child served it."""
    before = await pool_state(client)
    data, _, _ = await call(client, "execute_python", script=script, **arguments)
    after = await pool_state(client)
    assert after["forked"] == before["forked"] + 1, (before, after)
    assert after["preforked"] == before["preforked"] + 1, (before, after)
    return data


def fork_server_processes(data_dir: Path) -> dict[int, int]:
    """pid → parent pid of every process of this data directory's fork servers (the fork
    servers, their pre-forked children and forked runs), seen from the host."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            comm = (entry / "comm").read_text().strip()
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if b"forkserver.py" in cmdline and str(data_dir).encode() in cmdline and comm != "bwrap":
            found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


def waiting_children(data_dir: Path) -> list[int]:
    """The keepers of pre-forked children (and of runs in flight): children of a fork server."""
    procs = fork_server_processes(data_dir)
    servers = {pid for pid, parent in procs.items() if parent not in procs}
    return [pid for pid, parent in procs.items() if parent in servers]


def run_cgroups(pid: int) -> list[str]:
    """The run cgroups a server of this pid made that still exist (any hierarchy)."""
    left = []
    for root, dirs, _ in os.walk("/sys/fs/cgroup"):
        for name in dirs:
            if name.startswith(f"snakebox-{pid}-"):
                left.append(os.path.join(root, name))
        # Our cgroups sit a few levels down at most; do not walk the whole tree.
        if root.count("/") > 6:
            dirs.clear()
    return left


async def test_runs_are_served_by_pre_forked_children_that_saw_no_earlier_run(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "2") as client:
        await wait_prefork(client, 2)
        # Every property of a forked run's sandbox holds for one served by a pre-forked child.
        data = await preforked_run(client, PROBE)
        assert data["status"] == "ok", data
        seen = json.loads(data["stdout"])
        assert (seen["uid"], seen["gid"]) == (65534, 65534), seen
        assert (seen["pid"], seen["ppid"]) == (2, 1) and seen["pids"] == [1, 2], seen
        assert seen["cap_eff"] == seen["cap_bnd"] == seen["cap_prm"] == "0000000000000000", seen
        assert seen["no_new_privs"] == "1" and seen["seccomp"] == "2", seen
        assert seen["hostname"] == "sandbox" and seen["interfaces"] == ["lo"], seen
        assert seen["run_dirs_visible"] is False, seen
        assert seen["mount"] == "EPERM" and seen["unshare"] == "EPERM", seen
        assert seen["cwd"] == "/work" and seen["proc_sys_writable"] is False, seen
        assert int(seen["oom_score_adj"]) >= 500, seen
        # Files in /work, /tmp and /dev/shm, variables, a daemon: none reaches the next runs,
        # which were pre-forked before it (the next) and while it ran (the one after).
        await wait_prefork(client, 2)
        await runs_share_nothing(lambda script: preforked_run(client, script))


MODULE_STATE = r"""
import json, os, sys
seen = {
    "probe": getattr(json, "snakebox_probe", "original"),
    "modules": "snakebox_probe_module" in sys.modules,
    "tmp": sorted(os.listdir("/tmp")),
    "pids": sorted(int(p) for p in os.listdir("/proc") if p.isdigit()),
}
json.snakebox_probe = "changed by an earlier run"
sys.modules["snakebox_probe_module"] = json
os.environ["SNAKEBOX_PROBE"] = "set"
open("/tmp/probe-{tag}", "w").write("x")
print(json.dumps(seen))
"""


async def test_module_state_and_tmp_of_one_run_do_not_reach_the_next(snakebox_bin, data_dir):
    tag = uuid.uuid4().hex[:8]
    script = MODULE_STATE.replace("{tag}", tag)
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "1") as client:
        await wait_prefork(client, 1)
        runs = []
        for _ in range(3):
            data = await preforked_run(client, script)
            assert data["status"] == "ok", data
            runs.append(json.loads(data["stdout"]))
            # The next is served by a child made after this run: wait for it.
            await wait_prefork(client, 1)
        for seen in runs:
            assert seen["probe"] == "original" and seen["modules"] is False, seen
            assert not [name for name in seen["tmp"] if name.startswith("probe-")], seen
            assert seen["pids"] == [1, 2], seen
        env, _, _ = await call(client, "execute_python", script="import os\nprint(os.environ.get('SNAKEBOX_PROBE'))")
        assert env["stdout"] == "None\n", env


WARM_UP_TRACES = r"""
import json, linecache
print(json.dumps({
    "lines": sorted(name for name in linecache.cache if name.startswith("<") or name == "script.py"),
    "names": sorted(name for name in globals() if not name.startswith("__")),
}))
"""


async def test_the_warm_up_of_a_pre_forked_child_leaves_nothing_its_run_sees(snakebox_bin, data_dir):
    """A pre-forked child takes the runner's path once on the runner's own snippet while it
    waits (so its run copies no page of it from the fork server): its lines, its names and its
    value are not the run's."""
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "1") as client:
        await wait_prefork(client, 1)
        data = await preforked_run(client, WARM_UP_TRACES)
    assert data["status"] == "ok", data
    seen = json.loads(data["stdout"])
    assert seen == {"lines": ["script.py"], "names": ["json", "linecache"]}, seen
    assert data["result"] is None and not data["artifacts"], data


async def test_runs_with_other_limits_are_forked_when_they_come(snakebox_bin, data_dir):
    """A pre-forked child was made with the server's limits (its cgroup, its /tmp): a run held
    to a smaller memory limit is forked on demand instead, and that limit holds."""
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "1") as client:
        await wait_prefork(client, 1)
        before = await pool_state(client)
        data, _, _ = await call(
            client, "execute_python", script="x = bytearray(300 * 1024 * 1024)\nprint(len(x))", memory_limit="128m"
        )
        after = await pool_state(client)
        assert data["status"] == "memory_limit", data
        assert after["forked"] == before["forked"] + 1, (before, after)
        assert after["preforked"] == before["preforked"], (before, after)


async def test_pre_forked_children_are_bounded_reported_and_gone_with_their_fork_server(snakebox_bin, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    tmp_path.chmod(0o755)
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "3") as client:
        state = await wait_prefork(client, 3)
        assert state["prefork"] == 3, state
        pid = server_pid(data_dir)
        # Seen from the host: exactly three children wait beside the fork server, no more.
        deadline = time.monotonic() + 10
        while len(children := waiting_children(data_dir)) != 3:
            assert time.monotonic() < deadline, fork_server_processes(data_dir)
            await anyio.sleep(0.1)
        # ... and stays so: no more are made.
        await anyio.sleep(1)
        assert len(waiting_children(data_dir)) == 3, fork_server_processes(data_dir)
        assert len((await pool_state(client))["fork_server_details"]) == 1
        # Each run takes one, which is replaced: still three, none of them the one used.
        for _ in range(4):
            data = await preforked_run(client, "print('hi')")
            assert data["stdout"] == "hi\n", data
        await wait_prefork(client, 3)
        # (The keeper of the last run may still be on its way out.)
        deadline = time.monotonic() + 10
        while len(later := waiting_children(data_dir)) != 3:
            assert time.monotonic() < deadline, fork_server_processes(data_dir)
            await anyio.sleep(0.1)
        assert not set(later) & set(children), (children, later)

        # The fork server stops (killed from outside): its waiting children go with it, and
        # their cgroups; a new fork server gets children of its own.
        procs = fork_server_processes(data_dir)
        (old_server,) = [p for p, parent in procs.items() if parent not in procs]
        os.kill(old_server, signal.SIGKILL)
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{child}").exists() for child in later):
            assert time.monotonic() < deadline, "a pre-forked child outlived its fork server"
            await anyio.sleep(0.1)
        # (A stopped fork server is replaced when the next call comes.)
        data, _, _ = await call(client, "execute_python", script="print('meanwhile')")
        assert data["stdout"] == "meanwhile\n", data
        deadline = time.monotonic() + 60
        while True:
            state = await pool_state(client)
            details = state["fork_server_details"]
            if details and details[0]["prefork_ready"] >= 3:
                break
            assert time.monotonic() < deadline, state
            await anyio.sleep(0.2)
        # In each cgroup hierarchy: the new fork server's own and its three children's only
        # (once what served the call meanwhile, a pooled or cold sandbox, is removed).
        deadline = time.monotonic() + 10
        while True:
            per_hierarchy: dict[str, list[str]] = {}
            for path in run_cgroups(pid):
                per_hierarchy.setdefault(os.path.dirname(path), []).append(path)
            renewed = waiting_children(data_dir)
            if per_hierarchy and all(len(dirs) == 4 for dirs in per_hierarchy.values()) and len(renewed) == 3:
                break
            assert time.monotonic() < deadline, (per_hierarchy, renewed)
            await anyio.sleep(0.2)
        assert not set(renewed) & set(later), (later, renewed)
        data = await preforked_run(client, "print('after')")
        assert data["stdout"] == "after\n", data
    # The server shut down: no process of its fork servers, no cgroup of its runs is left.
    deadline = time.monotonic() + 10
    while fork_server_processes(data_dir) or run_cgroups(pid):
        assert time.monotonic() < deadline, (fork_server_processes(data_dir), run_cgroups(pid))
        await anyio.sleep(0.1)


def cpu_shares(pid: int) -> dict[str, int]:
    """`cpu.shares` of each run cgroup of the server `pid` in cgroup v1's cpu hierarchy."""
    return {
        path: int(Path(path, "cpu.shares").read_text())
        for path in run_cgroups(pid)
        if Path(path, "cpu.shares").exists()
    }


# See: issue 19 (performance): children were made at the default CPU share, so that making the
# next ones took the CPU from the runs in flight (a run's pid 1 waited for the fork server's
# new keeper, the reply for the new child's setup).
async def test_pre_forked_children_wait_at_a_small_cpu_share_and_a_run_gets_the_default(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "2") as client:
        await wait_prefork(client, 2)
        pid = server_pid(data_dir)
        if not cpu_shares(pid):
            pytest.skip("no cgroup v1 cpu hierarchy here")
        # The fork server's own cgroup has the default share, its two children the small one.
        # (The cgroup of the run that named the environment goes once that run is over.)
        deadline = time.monotonic() + 10
        while sorted((before := cpu_shares(pid)).values()) != [64, 64, 1024]:
            assert time.monotonic() < deadline, before
            await anyio.sleep(0.05)
        waiting = {path for path, shares in before.items() if shares == 64}
        async with anyio.create_task_group() as tasks:
            done: dict = {}

            async def sleeper() -> None:
                done.update((await call(client, "execute_python", script="import time; time.sleep(3); print('slept')"))[0])

            tasks.start_soon(sleeper)
            # While it runs, its cgroup (one of those two) has the default share; the others
            # (the one left and its replacement) wait at the small one.
            deadline = time.monotonic() + 10
            while not (running := {p for p, shares in cpu_shares(pid).items() if shares == 1024 and p in waiting}):
                assert time.monotonic() < deadline, cpu_shares(pid)
                await anyio.sleep(0.05)
            during = cpu_shares(pid)
            assert len(running) == 1 and list(during.values()).count(1024) == 2, (before, during)
            assert all(shares == 64 for path, shares in during.items() if path in waiting - running), during
        assert done["status"] == "ok" and done["stdout"] == "slept\n", done


async def test_prefork_off_forks_every_run_when_it_comes(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--prefork", "0") as client:
        data, _, _ = await call(client, "execute_python", script="print('warm')")
        assert data["status"] == "ok", data
        deadline = time.monotonic() + 30
        while (await pool_state(client))["fork_servers"] < 1:
            assert time.monotonic() < deadline
            await anyio.sleep(0.1)
        before = await pool_state(client)
        data, _, _ = await call(client, "execute_python", script="print('hi')")
        after = await pool_state(client)
        assert data["stdout"] == "hi\n", data
        assert after["prefork"] == 0 and after["preforked"] == 0, after
        assert after["forked"] == before["forked"] + 1, (before, after)
        assert after["fork_server_details"][0]["prefork_ready"] == 0, after
        await anyio.sleep(0.5)
        assert waiting_children(data_dir) == [], fork_server_processes(data_dir)


def test_prefork_is_bounded_by_configuration(snakebox_bin, tmp_path):
    """More than the bound is refused at start with a clear message."""
    done = subprocess.run(
        [str(snakebox_bin), "serve", "--data-dir", str(tmp_path), "--prefork", "1000"],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert done.returncode != 0
    assert "--prefork must be at most 16" in done.stderr, done.stderr
