"""Fail closed: without a working sandbox backend nothing runs, unless the operator asked for
`--sandbox-backend none` explicitly; `check_environment` tells the truth either way."""

from __future__ import annotations

import pytest

from conftest import call, connect

pytestmark = pytest.mark.anyio


@pytest.mark.native_only("a missing bwrap is the native backend's failure; the docker backend's (no engine) is test_docker's")
async def test_missing_bwrap_refuses_to_execute_and_says_how_to_fix_it(snakebox_bin, data_dir, mode, tmp_path):
    marker = tmp_path / "ran"
    async with connect(snakebox_bin, data_dir, mode, "--bwrap-path", "/nonexistent/bwrap") as client:
        data, text, is_error = await call(client, "execute_python", script=f"open({str(marker)!r}, 'w')\nprint('ran')")
        assert is_error
        assert data["status"] == "setup_failed"
        assert "bwrap" in data["error"]["message"]
        assert "--sandbox-backend none" in (data["error"]["hint"] or "")
        assert not marker.exists()
        assert data["stdout"] == ""

        report, _, _ = await call(client, "check_environment")
        assert report["isolation_active"] is False
        assert report["ready"] is False
        assert report["problems"]


async def test_explicit_none_backend_runs_and_reports_isolation_off(snakebox_bin, data_dir, mode):
    async with connect(snakebox_bin, data_dir, mode, "--sandbox-backend", "none") as client:
        data, _, is_error = await call(client, "execute_python", script="print('unsandboxed')")
        assert not is_error and data["status"] == "ok"
        assert data["stdout"] == "unsandboxed\n"
        report, _, _ = await call(client, "check_environment")
        assert report["sandbox_backend"] == "none"
        assert report["isolation_active"] is False


async def test_none_backend_timeout_still_kills_the_tree(snakebox_bin, data_dir, tmp_path):
    marker = tmp_path / "child-survived"
    child = f"import time; time.sleep(4); open({str(marker)!r}, 'w')"
    script = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen([sys.executable, '-c', {child!r}])\n"
        "print('started', flush=True)\n"
        "time.sleep(60)\n"
    )
    async with connect(snakebox_bin, data_dir, "auto", "--sandbox-backend", "none") as client:
        data, _, _ = await call(client, "execute_python", script=script, timeout_seconds=1)
        assert data["status"] == "timeout"
        assert data["stdout"] == "started\n"
        import anyio

        await anyio.sleep(5)
        # Proof of life, then the denial: the grandchild was killed with the tree.
        alive, _, _ = await call(client, "execute_python", script="print('alive')")
        assert alive["stdout"] == "alive\n"
    assert not marker.exists()
