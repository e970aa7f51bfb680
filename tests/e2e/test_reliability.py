"""Reliability regressions (issue 12), through the real binary and the official MCP client."""

from __future__ import annotations

import shutil

import pytest

from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


# See: issue 12 (7): after `<data>/uv-cache` was deleted, every build failed until a restart.
async def test_builds_work_again_after_uv_cache_is_removed(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        first, text, _ = await call(client, "execute_python", script="import six; print(six.__version__)", dependencies=["six==1.16.0"], timeout_seconds=120)
        assert first["status"] == "ok" and first["stdout"] == "1.16.0\n", text
        shutil.rmtree(data_dir / "uv-cache")
        again, text, _ = await call(client, "execute_python", script="import six; print(six.__version__)", dependencies=["six==1.15.0"], timeout_seconds=120)
        assert again["status"] == "ok" and again["stdout"] == "1.15.0\n", text
        assert (data_dir / "uv-cache").is_dir()
