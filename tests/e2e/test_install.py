"""Installing where users are: the `snakebox-mcp` wheel (pyproject.toml, maturin's `bin`
bindings) built and run with `uvx` from a local file, as a user would run it from the package
index. The wheel is built in the dev profile, which reuses the debug build the suite already
made (a release build costs minutes); `scripts/build-wheel` builds the release one the same way,
and `SNAKEBOX_WHEEL=dist/snakebox_mcp-….whl` runs these tests against that one instead."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from mcp import Client
from mcp.client.stdio import StdioServerParameters

from conftest import REPO, backend_flags, call

pytestmark = pytest.mark.anyio


def _uvx() -> list[str]:
    """`uvx`, or the same thing spelled `uv tool run` when only `uv` is found."""
    found = shutil.which("uvx")
    if found:
        return [found]
    uv = shutil.which("uv")
    if uv is None:
        import uv as uv_module  # uv installed by pip into this interpreter

        uv = uv_module.find_uv_bin()
    return [uv, "tool", "run"]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    given = os.environ.get("SNAKEBOX_WHEEL")
    if given:
        return Path(given).resolve()
    maturin = Path(sys.executable).parent / "maturin"
    assert maturin.exists(), "maturin is installed by tests/e2e/requirements.txt"
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run(
        [str(maturin), "build", "--profile", "dev", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=1800,
    )
    assert done.returncode == 0, done.stderr
    wheels = list(out.glob("snakebox_mcp-*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


@pytest.fixture
def uv_env(tmp_path: Path) -> dict[str, str]:
    """uv's own state in the test's directory; nothing may be downloaded (the wheel has no
    dependencies, and the tool environment uses an interpreter already on the machine)."""
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": os.environ.get("HOME", str(tmp_path)),
        "UV_TOOL_DIR": str(tmp_path / "uv-tools"),
        "UV_CACHE_DIR": str(tmp_path / "uv-cache"),
        "UV_PYTHON_DOWNLOADS": "never",
        "UV_OFFLINE": "1",
        "SNAKEBOX_LOG": "warn",
    }


def test_wheel_carries_the_binary_as_the_snakebox_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        scripts = [name for name in names if name.endswith(".data/scripts/snakebox")]
        assert len(scripts) == 1, names
        info = archive.getinfo(scripts[0])
        assert (info.external_attr >> 16) & 0o111, "the binary is executable"
        assert archive.read(scripts[0])[:4] == b"\x7fELF"
        metadata = next(name for name in names if name.endswith(".dist-info/METADATA"))
        assert "Name: snakebox-mcp" in archive.read(metadata).decode()


def test_uvx_runs_the_wheel(wheel, uv_env):
    done = subprocess.run(
        [*_uvx(), "--from", str(wheel), "snakebox", "--help"],
        env=uv_env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "Usage: snakebox" in done.stdout and "serve" in done.stdout


async def test_uvx_serves_mcp_and_runs_python(wheel, uv_env, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o755)
    params = StdioServerParameters(
        command=_uvx()[0],
        args=[*_uvx()[1:], "--from", str(wheel), "snakebox", "serve", "--data-dir", str(data_dir), "--no-warm-cache", *backend_flags()],
        env=uv_env,
    )
    async with Client(params, mode="auto", read_timeout_seconds=300) as client:
        data, text, is_error = await call(client, "execute_python", script="import sys\nprint(6 * 7, sys.version_info[0])\n")
    assert not is_error, text
    assert data["status"] == "ok" and data["stdout"] == "42 3\n"
