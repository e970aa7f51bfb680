"""Python versions the host lacks (issue 16 (7)): refused with the fix named, added by
`snakebox python install`, or downloaded when a call asks with `python_downloads =
"automatic"` — and then run in the sandbox like any other interpreter.

No interpreter can be downloaded on these machines, so the download source is a local
mirror built here from an interpreter pyenv already has, in python-build-standalone's
layout: `<mirror>/<build>/cpython-<version>+<build>-<triple>-install_only.tar.gz` (a
`python/` tree), listed in a downloads JSON whose URLs are python-build-standalone's own, so
uv reaches the archive only through `UV_PYTHON_INSTALL_MIRROR` (file://). The JSON
(`UV_PYTHON_DOWNLOADS_JSON_URL`) is needed because uv checks the SHA-256 of the archives it
knows, and this one is ours. Each server gets a fresh HOME, so uv's Python directory starts
empty and pyenv's interpreters are not found.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import REPO, call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

BUILD = "20991231"
PBS = "https://github.com/astral-sh/python-build-standalone/releases/download"


def real_uv() -> str | None:
    """The uv binary itself (a pyenv shim does not work with another HOME)."""
    found = shutil.which("uv")
    if found and Path(found).read_bytes()[:2] == b"#!":
        which = subprocess.run(["pyenv", "which", "uv"], capture_output=True, text=True)
        found = which.stdout.strip() if which.returncode == 0 else None
    return str(Path(found).resolve()) if found else None


def system_minors() -> set[str]:
    """Minor versions a server would find without pyenv (`/usr/bin`, `/usr/local/bin`)."""
    minors = set()
    for directory in ("/usr/bin", "/usr/local/bin"):
        for path in Path(directory).glob("python3.*"):
            rest = path.name.removeprefix("python3.")
            if rest.isdigit():
                minors.add(f"3.{rest}")
    return minors


def pyenv_source() -> Path | None:
    """A pyenv CPython (3.8+) of a minor version the system has not: the one to 'download'."""
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv")) / "versions"
    if not root.is_dir():
        return None
    taken = system_minors()
    candidates = []
    for entry in root.iterdir():
        parts = entry.name.split(".")
        if len(parts) == 3 and all(p.isdigit() for p in parts) and parts[0] == "3" and int(parts[1]) >= 8:
            if f"3.{parts[1]}" not in taken and (entry / "bin" / f"python3.{parts[1]}").exists():
                candidates.append((int(parts[1]), entry))
    # Prefer 3.10: small and far from the system's.
    candidates.sort(key=lambda c: (c[0] != 10, c[0]))
    return candidates[0][1] if candidates else None


def relocatable(binary: Path, old_prefix: str) -> None:
    """pyenv links its binaries with RUNPATH `<prefix>/lib`: point it at `$ORIGIN/../lib` (a
    shorter string, NUL-padded in place), as python-build-standalone's are."""
    data = binary.read_bytes()
    old = f"{old_prefix}/lib".encode()
    new = b"$ORIGIN/../lib"
    if data.count(old) == 1 and len(new) <= len(old):
        binary.write_bytes(data.replace(old, new + b"\0" * (len(old) - len(new))))


@pytest.fixture(scope="module")
def mirror() -> tuple[Path, str]:
    """(mirror directory, version): built once, kept in target/ across runs."""
    if not real_uv():
        pytest.skip("uv is not installed")
    source = pyenv_source()
    if source is None:
        pytest.skip("no pyenv CPython of a version the system lacks, to build a local interpreter mirror from")
    version = source.name
    minor = ".".join(version.split(".")[:2])
    root = REPO / "target" / "e2e-python-mirror" / version
    archive_name = f"cpython-{version}+{BUILD}-x86_64-unknown-linux-gnu-install_only.tar.gz"
    archive = root / BUILD / archive_name
    listing = root / "downloads.json"
    if not listing.exists():
        stage = root / "stage"
        shutil.rmtree(stage, ignore_errors=True)
        shutil.copytree(source, stage / "python", symlinks=True,
                        ignore=shutil.ignore_patterns("test", "tests", "__pycache__", "idlelib", "tkinter", "site-packages", "*.a"))
        (stage / "python" / "lib" / f"python{minor}" / "site-packages").mkdir(exist_ok=True)
        for binary in [stage / "python" / "bin" / f"python{minor}", *(stage / "python" / "lib").glob("libpython*.so*")]:
            if binary.is_file() and not binary.is_symlink():
                relocatable(binary, str(source))
        archive.parent.mkdir(parents=True, exist_ok=True)
        with tarfile.open(archive, "w:gz", compresslevel=1) as tar:
            tar.add(stage / "python", arcname="python")
        shutil.rmtree(stage)
        major, minor_n, patch = (int(p) for p in version.split("."))
        entry = {
            "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux", "libc": "gnu",
            "major": major, "minor": minor_n, "patch": patch, "prerelease": "",
            "url": f"{PBS}/{BUILD}/{archive_name}",
            "sha256": hashlib.sha256(archive.read_bytes()).hexdigest(), "variant": None, "build": BUILD,
        }
        listing.write_text(json.dumps({f"cpython-{version}-linux-x86_64-gnu": entry}))
    return root, version


def server_env(home: Path, root: Path) -> dict[str, str]:
    home.mkdir(parents=True, exist_ok=True)
    return {
        "HOME": str(home),
        "PATH": "/usr/bin:/bin",
        "UV_PYTHON_INSTALL_MIRROR": f"file://{root}",
        "UV_PYTHON_DOWNLOADS_JSON_URL": f"file://{root}/downloads.json",
    }


WHERE = "import sys\nprint(sys.version.split()[0])\nprint(sys.base_prefix)"


async def test_a_missing_version_is_refused_with_the_fix_then_installed_and_run(snakebox_bin: Path, mirror: tuple[Path, str], tmp_path: Path):
    root, version = mirror
    minor = ".".join(version.split(".")[:2])
    home = tmp_path / "home"
    env = server_env(home, root)
    uv = ["--uv-path", str(real_uv())]

    # Downloads off (the default): refused, naming both fixes.
    async with connect(snakebox_bin, tmp_path / "data", "auto", *uv, env=env) as client:
        data, text, is_error = await call(client, "execute_python", script=WHERE, python_version=minor)
        assert is_error and data["status"] == "setup_failed", text
        assert data["error"]["kind"] == "unavailable"
        assert f"Python {minor} (from python_version) is not on this host" in data["error"]["message"], data
        hint = data["error"]["hint"]
        assert 'python_downloads = "automatic"' in hint and f"snakebox python install {minor}" in hint, hint
        report, _, _ = await call(client, "check_environment")
        assert report["python_downloads"] == "never"

    # The operator installs it: uv, through the mirror, into the user's uv directory.
    installed = subprocess.run([str(snakebox_bin), "python", "install", minor, *uv, "--data-dir", str(tmp_path / "data")],
                               env=env, capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr
    managed = home / ".local" / "share" / "uv" / "python"
    assert f"Python {version} is ready: {managed}" in installed.stdout, installed.stdout
    assert "Downloaded" in installed.stderr, installed.stderr

    # A new server finds it and runs code with it, in the sandbox (where it is mounted).
    async with connect(snakebox_bin, tmp_path / "data", "auto", *uv, env=env) as client:
        data, text, is_error = await call(client, "execute_python", script=WHERE, python_version=minor)
        assert not is_error and data["status"] == "ok", text
        said_version, prefix = data["stdout"].split()
        assert said_version == version and data["python_version"] == version
        assert prefix.startswith(str(managed)), prefix
        report, _, _ = await call(client, "check_environment")
        assert any(p["version"] == version and p["source"] == "uv-managed" for p in report["pythons"]), report["pythons"]

    # A version the source does not offer: uv's word, and what to do.
    refused = subprocess.run([str(snakebox_bin), "python", "install", "3.8.1", *uv, "--data-dir", str(tmp_path / "data")],
                             env=env, capture_output=True, text=True, timeout=600)
    assert refused.returncode != 0
    assert "No download found" in refused.stderr and "hint: the download source does not offer" in refused.stderr, refused.stderr


async def test_automatic_downloads_fetch_the_version_a_call_asks_for(snakebox_bin: Path, mirror: tuple[Path, str], tmp_path: Path):
    root, version = mirror
    minor = ".".join(version.split(".")[:2])
    home = tmp_path / "home"
    env = server_env(home, root)
    args = ["--uv-path", str(real_uv()), "--python-downloads", "automatic"]
    async with connect(snakebox_bin, tmp_path / "data", "auto", *args, env=env) as client:
        report, _, _ = await call(client, "check_environment")
        assert report["python_downloads"] == "automatic"
        assert all(not p["version"].startswith(minor + ".") for p in report["pythons"]), report["pythons"]

        data, text, is_error = await call(client, "execute_python", script=WHERE, python_version=minor, timeout_seconds=120)
        assert not is_error and data["status"] == "ok", text
        said_version, prefix = data["stdout"].split()
        assert said_version == version and prefix.startswith(str(home / ".local" / "share" / "uv" / "python")), data["stdout"]

        # A session on it too (found now without another download).
        session, text, is_error = await call(client, "create_session", python_version=minor)
        assert not is_error and session["python_version"] == version, text
        await call(client, "delete_session", session_id=session["session_id"])

        # Not offered by the source: the call fails with uv's reason and a hint; the server lives.
        data, text, is_error = await call(client, "execute_python", script="print(1)", python_version="3.8.1")
        assert is_error and data["status"] == "setup_failed", text
        assert "No download found" in data["error"]["message"] and "download source" in data["error"]["hint"], data
        data, _, is_error = await call(client, "execute_python", script="print('alive')")
        assert not is_error and data["stdout"] == "alive\n"


async def test_automatic_downloads_fetch_a_missing_default_at_start(snakebox_bin: Path, mirror: tuple[Path, str], tmp_path: Path):
    """`--python-version` names a version the host lacks: with downloads on, the server
    fetches it before it starts serving (without, it refuses to start: test_cli.py)."""
    root, version = mirror
    minor = ".".join(version.split(".")[:2])
    env = server_env(tmp_path / "home", root)
    args = ["--uv-path", str(real_uv()), "--python-downloads", "automatic", "--python-version", minor]
    async with connect(snakebox_bin, tmp_path / "data", "auto", *args, env=env) as client:
        data, text, is_error = await call(client, "execute_python", script=WHERE)
        assert not is_error and data["python_version"] == version, text
