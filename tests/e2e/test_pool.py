"""The warm pool (issue 5): pre-started sandboxes, each used for exactly one run.

These run with `--fork-server off`: with it on, runs of the default environment are forked
instead (test_forkserver.py), and the pool keeps no sandboxes for it.

A pooled run must be indistinguishable from a cold one: nothing of one run (files in /work,
/tmp and /dev/shm, environment variables, processes) is visible to the next; a timeout keeps
the output printed before and kills the whole tree, counting from the request (not from when
the sandbox was started); the pool refills in the background; calls the pool cannot serve
(another network setting) run cold and still work."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import anyio
import pytest

from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


# The pool alone serves the default environment.
POOL_ONLY = ("--fork-server", "off")


async def pool_state(client) -> dict:
    report, _, _ = await call(client, "check_environment")
    return report["warm_pool"]


async def wait_ready(client, count: int, seconds: float = 20.0) -> dict:
    """Wait until `count` sandboxes for the default environment are ready."""
    deadline = time.monotonic() + seconds
    while True:
        state = await pool_state(client)
        if state["ready_default"] >= count:
            return state
        assert time.monotonic() < deadline, f"the pool did not refill: {state}"
        await anyio.sleep(0.1)


async def pooled_run(client, script: str, **arguments) -> dict:
    """Run `script` in a pre-started sandbox (checked through the pool's counters)."""
    before = await wait_ready(client, 1)
    data, _, _ = await call(client, "execute_python", script=script, **arguments)
    after = await pool_state(client)
    assert after["served"] == before["served"] + 1, (before, after)
    return data


LEAVE_TRACES = """
import os, subprocess, sys
open('/work/trace-{tag}.txt', 'w').write('work')
open('/tmp/trace-{tag}.txt', 'w').write('tmp')
open('/dev/shm/trace-{tag}', 'w').write('shm')
os.environ['TRACE_{tag}'] = '1'
# A daemon that would outlive the run if anything were shared.
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)  # trace-{tag}'],
                 start_new_session=True,
                 stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
print(os.getpid())
"""

LOOK_FOR_TRACES = """
import json, os
def listing(path):
    try:
        return sorted(os.listdir(path))
    except OSError as err:
        return [repr(err)]
processes = []
for pid in os.listdir('/proc'):
    if pid.isdigit():
        try:
            processes.append(open('/proc/%s/cmdline' % pid, 'rb').read().replace(b'\\0', b' ').decode())
        except OSError:
            pass
print(json.dumps({
    'work': listing('/work'),
    'tmp': listing('/tmp'),
    'shm': listing('/dev/shm'),
    'env': sorted(k for k in os.environ if k.startswith('TRACE_')),
    'processes': processes,
    'stdin': __import__('sys').stdin.read(),
}))
"""


@pytest.mark.docker_ci
async def test_consecutive_pooled_runs_share_nothing(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", *POOL_ONLY) as client:
        assert (await pool_state(client))["size"] == 2
        # The first call names the default environment (cache warming is off in this suite).
        warmup, _, _ = await call(client, "execute_python", script="print('warm')")
        assert warmup["status"] == "ok", warmup
        await runs_share_nothing(lambda script: pooled_run(client, script))


async def runs_share_nothing(run) -> None:
    """One run leaves traces everywhere it can; the next two (`run(script)` returns the
    result) find none of them, and the first run's daemon is gone from the host."""
    tag = uuid.uuid4().hex[:8]
    first = await run(LEAVE_TRACES.format(tag=tag))
    assert first["status"] == "ok", first
    for _ in range(2):
        # Twice: the next sandbox (or fork) may have been made before the first run, the one
        # after it while or after it ran.
        second = await run(LOOK_FOR_TRACES)
        assert second["status"] == "ok", second
        seen = json.loads(second["stdout"])
        assert seen["work"] == [], seen
        # (/tmp may hold the mount points of the environment, when the data directory is under
        # /tmp, as in this suite.)
        assert not [name for name in seen["tmp"] if "trace" in name], seen
        assert seen["shm"] == [], seen
        assert seen["env"] == [], seen
        assert seen["stdin"] == "", seen
        assert not any("trace-" in p for p in seen["processes"]), seen
        # Only this run's own interpreter, the runner's reaper (its parent, which reports how
        # it ends: X-01) and the sandbox's init are there, all of them this run's.
        assert len(seen["processes"]) <= 3, seen
        # (A forked run and its init have the fork server's command line.)
        assert all("/snakebox/runner.py" in p or "/forkserver.py" in p or p.startswith("bwrap") or "bwrap" in p.split()[0] for p in seen["processes"]), seen
    # The daemon of the first run did not survive it on the host either.
    left = subprocess.run(["pgrep", "-f", f"trace-{tag}"], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


def outlives_its_timeout(marker: str) -> str:
    """A script that prints, starts a detached child carrying `marker`, and sleeps past any
    timeout."""
    return f"""
import subprocess, sys, time
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(1000)  # {marker}'],
                 start_new_session=True)
print('before the timeout', flush=True)
time.sleep(100)
"""


async def test_a_pooled_timeout_keeps_output_and_kills_the_tree(snakebox_bin, data_dir):
    marker = f"pool-tree-{uuid.uuid4().hex[:8]}"
    script = outlives_its_timeout(marker)
    async with connect(snakebox_bin, data_dir, "legacy", *POOL_ONLY) as client:
        await call(client, "execute_python", script="print('warm')")
        # The pooled sandboxes were started well before the call: the limit counts from
        # the request, so a 2 s script under a 3 s limit still finishes.
        await wait_ready(client, 2)
        await anyio.sleep(3.5)
        slow = await pooled_run(client, "import time; time.sleep(2); print('done')", timeout_seconds=3)
        assert slow["status"] == "ok", slow
        assert slow["stdout"].strip() == "done"

        started = time.monotonic()
        data = await pooled_run(client, script, timeout_seconds=2)
        elapsed = time.monotonic() - started
        assert data["status"] == "timeout", data
        assert data["timed_out"] is True
        assert "before the timeout" in data["stdout"]
        assert elapsed < 10, elapsed
        deadline = time.monotonic() + 5
        while subprocess.run(["pgrep", "-f", marker], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "a process of the timed-out run survived"
            await anyio.sleep(0.1)


async def test_the_pool_refills_and_reports_its_state(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--warm-pool", "3", *POOL_ONLY) as client:
        state = await pool_state(client)
        assert state["size"] == 3 and state["active"] is True, state
        await call(client, "execute_python", script="print('warm')")
        await wait_ready(client, 3)
        for index in range(4):
            data, _, _ = await call(client, "execute_python", script=f"print({index})")
            assert data["status"] == "ok" and data["stdout"].strip() == str(index), data
        state = await wait_ready(client, 3, seconds=15)
        assert state["ready_default"] == 3, state
        assert state["served"] >= 3, state
        assert state["last_error"] is None, state


async def test_warm_pool_zero_runs_everything_cold(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy", "--warm-pool", "0") as client:
        for _ in range(2):
            data, _, _ = await call(client, "execute_python", script="print('cold')")
            assert data["status"] == "ok" and data["stdout"].strip() == "cold", data
        await anyio.sleep(0.5)
        state = await pool_state(client)
        assert state == {
            "size": 0,
            "active": False,
            "ready": 0,
            "ready_default": 0,
            "environments": [],
            "served": 0,
            "cold_starts": 0,
            "last_error": None,
            "fork_servers": 0,
            "forked": 0,
            "fork_server_error": None,
            "fork_server_details": [],
            "prefork": 0,
            "preforked": 0,
        }, state


async def test_a_call_with_another_network_setting_runs_cold(snakebox_bin, data_dir):
    interfaces = "import json, socket\nprint(json.dumps(sorted(n for _, n in socket.if_nameindex())))\n"
    async with connect(snakebox_bin, data_dir, "legacy", "--network", "on", *POOL_ONLY) as client:
        await call(client, "execute_python", script="print('warm')")
        await wait_ready(client, 2)
        before = await pool_state(client)
        offline, _, _ = await call(client, "execute_python", script=interfaces, network=False)
        assert offline["status"] == "ok", offline
        assert offline["stdout"].strip() == '["lo"]'
        after = await pool_state(client)
        assert after["served"] == before["served"], (before, after)
        assert after["cold_starts"] == before["cold_starts"] + 1, (before, after)
        # The default setting is still served warm.
        shared = await pooled_run(client, interfaces)
        assert shared["status"] == "ok", shared
