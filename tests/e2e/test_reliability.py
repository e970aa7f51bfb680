"""Reliability regressions (issue 12), through the real binary and the official MCP client."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from conftest import call, connect, have_bwrap, server_pid

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


# See: issue 12 (7): after uv's cache (`<data>/installs-v1/uv-cache`) was deleted, every build failed until a restart.
async def test_builds_work_again_after_uv_cache_is_removed(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        first, text, _ = await call(client, "execute_python", script="import six; print(six.__version__)", dependencies=["six==1.16.0"], timeout_seconds=120)
        assert first["status"] == "ok" and first["stdout"] == "1.16.0\n", text
        shutil.rmtree(data_dir / "installs-v1" / "uv-cache")
        again, text, _ = await call(client, "execute_python", script="import six; print(six.__version__)", dependencies=["six==1.15.0"], timeout_seconds=120)
        assert again["status"] == "ok" and again["stdout"] == "1.15.0\n", text
        assert (data_dir / "installs-v1" / "uv-cache").is_dir()


def _cgroups_of(pid: int) -> list[str]:
    root = Path("/sys/fs/cgroup")
    return [str(d) for d in root.glob(f"*/snakebox-{pid}-*") if d.is_dir()]


# See: issue 12 (6): cgroups leaked after fork bombs on the cold path (fork server off): removals
# failed while the bomb's processes were still dying, and empty directories were left after a
# clean exit.
async def test_no_cgroup_is_left_after_fork_bombs_on_the_cold_path(snakebox_bin, data_dir):
    bomb = "import os\nprint('bombing', flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    async with connect(snakebox_bin, data_dir, "legacy", "--fork-server", "off", "--warm-pool", "0", "--max-processes", "64") as client:
        pid = server_pid(data_dir)
        for _ in range(3):
            data, text, _ = await call(client, "execute_python", script=bomb, timeout_seconds=2)
            assert data["status"] == "timeout" and "bombing" in data["stdout"], text
        during = _cgroups_of(pid)
        ok, _, _ = await call(client, "execute_python", script="print('after')")
        assert ok["stdout"] == "after\n", ok
    # The server exited cleanly (stdin closed): none of its cgroups is left.
    deadline = time.monotonic() + 10
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not Path(f"/proc/{pid}").exists(), "the server did not exit"
    assert _cgroups_of(pid) == [], (during, _cgroups_of(pid))
