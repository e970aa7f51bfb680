"""The tool set of Python Code Executor (issue 36; seed 004): with `serve --compat-tools
code-executor`, its README's calls run end to end with its tool names and argument names:
`execute_python(code, timeout)`, `install_package` with one string of several specifiers,
`list_installed_packages`, `reset_sandbox`, `get_sandbox_info`. Each caller has one sandbox (a
snakebox session named `code-executor`, made on first use) that every tool of the set shares,
so a package installed with `install_package` is importable in `execute_python`.

Also here: what `--compat-tools` accepts (a list; `true` still means IBM's set), and the
refusals with a hint (an unknown name; `ibm` and `code-executor` together, which both have a
`get_sandbox_info`).

The packages come from a local index (`UV_INDEX_URL`): small stand-in wheels named as in the
README, so the test needs no PyPI.
"""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest

from conftest import call, connect, have_bwrap
from test_builds import Index, wheel_bytes

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

VERSIONS = {"numpy": "1.26.4", "pandas": "2.2.0", "matplotlib": "3.8.0", "seaborn": "0.13.0", "requests": "2.31.0"}


@pytest.fixture(scope="module")
def index() -> Any:
    idx = Index("user", f"tok-{secrets.token_hex(6)}")
    for name, version in VERSIONS.items():
        idx.add(wheel_bytes(name, version, {f"{name}/__init__.py": f"__version__ = {version!r}\n"}))
    yield idx
    idx.close()


def fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o755)
    return path


async def test_the_readme_examples_of_python_code_executor(snakebox_bin, tmp_path, index, mode):
    async with connect(snakebox_bin, fresh(tmp_path / "data"), mode, "--compat-tools", "code-executor",
                       env={"UV_INDEX_URL": index.url}) as client:
        tools = {tool.name: tool for tool in (await client.list_tools()).tools}
        assert {"execute_python", "install_package", "list_installed_packages", "reset_sandbox",
                "get_sandbox_info"} <= set(tools), sorted(tools)
        # Its execute_python, with its argument names, takes the place of snakebox's own.
        assert set(tools["execute_python"].input_schema["properties"]) == {"code", "timeout"}
        assert tools["execute_python"].input_schema["required"] == ["code"]

        # execute_python: the README's two examples.
        data, text, is_error = await call(client, "execute_python", code="print('Hello, World!')")
        assert not is_error and data["stdout"] == "Hello, World!\n" and data["status"] == "ok", text
        assert "--- stdout ---" in text  # snakebox's text sections, which carry stdout and stderr
        data, _, _ = await call(client, "execute_python", code="import math; print(math.sqrt(16))")
        assert data["stdout"] == "4.0\n", data
        # timeout (seconds): a run past it is stopped and says so.
        data, _, _ = await call(client, "execute_python", code="import time; time.sleep(30)", timeout=2)
        assert data["status"] == "timeout", data

        # install_package: the README's three examples; one string of several is split.
        data, text, is_error = await call(client, "install_package", packages="numpy")
        assert not is_error and data["success"] is True and data["requested"] == ["numpy"], text
        data, text, _ = await call(client, "install_package", packages="pandas matplotlib seaborn")
        assert data["success"] is True and data["requested"] == ["pandas", "matplotlib", "seaborn"], text
        data, text, _ = await call(client, "install_package", packages="requests>=2.28.0")
        assert data["success"] is True and "requests==2.31.0" in data["installed_packages"], text
        # Nothing named: refused with a hint.
        data, text, is_error = await call(client, "install_package", packages=" , ")
        assert is_error and "names no package" in data["error"]["message"] and data["error"]["hint"], text

        # list_installed_packages: all five, with their versions.
        data, _, _ = await call(client, "list_installed_packages")
        listed = {p["name"]: p["version"] for p in data["packages"]}
        assert VERSIONS.items() <= listed.items() and data["count"] == len(data["packages"]), data

        # The sandbox is shared: what install_package put there, execute_python imports.
        data, text, _ = await call(client, "execute_python", code="import numpy, seaborn; print(numpy.__version__, seaborn.__version__)")
        assert data["stdout"] == "1.26.4 0.13.0\n", text

        # get_sandbox_info: Python version, path, status.
        info, text, _ = await call(client, "get_sandbox_info")
        assert info["status"] == "ready" and info["python_version"].startswith("3.") and info["path"] == "/work", text
        assert info["package_count"] >= len(VERSIONS)

        # One sandbox per caller, a snakebox session, reachable with the session tools too.
        sessions, _, _ = await call(client, "list_sessions")
        assert [s["name"] for s in sessions["sessions"]] == ["code-executor"], sessions
        assert sessions["sessions"][0]["session_id"] == info["sandbox_id"]

        # reset_sandbox: a clean state, packages removed.
        data, text, is_error = await call(client, "reset_sandbox")
        assert not is_error and data["success"] is True, text
        data, _, _ = await call(client, "list_installed_packages")
        assert not {p["name"] for p in data["packages"]} & set(VERSIONS), data
        # (Asked without an import statement: with the tool sets, a cell importing a well-known
        # package it did not declare gets it, --infer-dependencies.)
        data, _, _ = await call(client, "execute_python",
                                code="import importlib.util\nprint([importlib.util.find_spec(n) for n in ('numpy', 'seaborn')])")
        assert data["stdout"] == "[None, None]\n", data
        sessions, _, _ = await call(client, "list_sessions")
        assert len(sessions["sessions"]) == 1, sessions


def start(binary: Path, data_dir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAKEBOX_LOG": "warn"}
    return subprocess.run([str(binary), "serve", "--data-dir", str(data_dir), "--no-warm-cache", *args],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60, env=env)


def test_compat_tools_refuses_an_unknown_set_and_two_that_clash_with_a_hint(snakebox_bin, tmp_path):
    unknown = start(snakebox_bin, tmp_path / "data", "--compat-tools", "ibm,mcp-sandbox")
    assert unknown.returncode != 0 and "unknown tool set `mcp-sandbox`" in unknown.stderr, unknown.stderr
    assert "hint: the tool sets are ibm, python-mcp-sandbox, code-executor" in unknown.stderr
    clash = start(snakebox_bin, tmp_path / "data", "--compat-tools", "ibm,code-executor")
    assert clash.returncode != 0 and "get_sandbox_info" in clash.stderr and "hint: serve one of them" in clash.stderr, clash.stderr


async def test_compat_tools_serves_each_set_named_and_true_still_means_ibm(snakebox_bin, tmp_path):
    data_dir = fresh(tmp_path / "data")
    async with connect(snakebox_bin, data_dir, "auto", "--compat-tools", "ibm,python-mcp-sandbox") as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"execute_code", "validate_code", "get_sandbox_info", "create_sandbox", "execute_python_code"} <= names
    assert "install_package" not in names
    async with connect(snakebox_bin, data_dir, "auto", env={"SNAKEBOX_COMPAT_TOOLS": "true"}) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert {"execute_code", "get_sandbox_info"} <= names and "create_sandbox" not in names
