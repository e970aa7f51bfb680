"""Environments verified before they are published, hard links into uv's cache that no
caller-chosen code can write through, and honest space errors (issue 12, items 1, 2 and 7),
through the real binary, real uv and real bubblewrap.

Packages are built here with the standard library and served from a local simple index on
127.0.0.1 (`test_builds.Index`); nothing is fetched from the internet. Everything is judged
from outside the sandbox: inodes, link counts, owners and hashes of uv's cache files, the
environments directory, the build directory.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import secrets
import stat
import subprocess
from pathlib import Path
from typing import Any, AsyncIterator

import pytest

from attacks_support import marker_pids
from conftest import call, connect, have_bwrap
from host_support import wait_for
from test_builds import Index, compilation, compilations_ended, compiled, wheel_bytes

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="uid switching (and tmpfs mounts) need root"),
]
MODE = "auto"
INSTALLER_UID = 65533


@pytest.fixture(scope="module")
def index() -> Any:
    idx = Index("user", f"tok-{secrets.token_hex(6)}")
    yield idx
    idx.close()


@contextlib.asynccontextmanager
async def server(snakebox_bin: Path, data_dir: Path, index: Index, *args: str) -> AsyncIterator[Any]:
    async with connect(snakebox_bin, data_dir, MODE, *args, env={"UV_INDEX_URL": index.url}) as client:
        yield client


async def run(client: Any, script: str, deps: list[str], timeout: int = 120) -> tuple[dict[str, Any], str, bool]:
    return await call(client, "execute_python", script=script, dependencies=deps, timeout_seconds=timeout)


def fresh(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o755)
    return path


def environments(data_dir: Path) -> set[str]:
    envs = data_dir / "environments-v1"
    return {p.name for p in envs.iterdir()} if envs.is_dir() else set()


def builds_left(data_dir: Path) -> list[str]:
    builds = data_dir / "installs-v1" / "builds"
    return [p.name for p in builds.iterdir()] if builds.is_dir() else []


def find_in_cache(data_dir: Path, relative: str) -> list[Path]:
    """Files of uv's cache whose path ends with `relative` (its unpacked wheels)."""
    found = []
    for root, _dirs, files in os.walk(data_dir):
        for name in files:
            path = Path(root) / name
            if str(path).endswith(relative) and "/uv-cache/" in str(path):
                found.append(path)
    return found


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def published(data_dir: Path, requirement: str) -> tuple[Path, dict[str, Any]]:
    """The one published environment of `requirement`, and its manifest (read from outside)."""
    found = []
    for env in (data_dir / "environments-v1").iterdir():
        manifest = json.loads((env / "snakebox-env.json").read_text())
        if requirement in manifest["requirements"]:
            found.append((env, manifest))
    assert len(found) == 1, found
    return found[0]


# ---------------------------------------------------------------------------------------------
# Item 2: hard links, and no caller-chosen code can write through them.
# ---------------------------------------------------------------------------------------------

# A `.pth` line that runs while the environment is compiled (package code, site-packages
# writable by its uid): it tries to write, truncate and chmod its own installed module, a hard
# link into uv's cache, and records what happened in a proof file (proof of life).
LINK_BOOT = r'''
import errno, json, os
site = os.path.dirname(os.path.abspath(__file__))
proof = os.path.join(site, "sbxlink_proof.json")
target = os.path.join(site, "sbxlinked", "__init__.py")
def attempt(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno
def append():
    with open(target, "a") as f:
        f.write("\nPWNED = True\n")
if os.access(site, os.W_OK) and not os.path.exists(proof):
    st = os.stat(target)
    seen = {"uid": os.getuid(), "nlink": st.st_nlink, "owner": st.st_uid,
            "append": attempt(append), "truncate": attempt(lambda: os.truncate(target, 0)),
            "chmod": attempt(lambda: os.chmod(target, 0o666)),
            "open_rw": attempt(lambda: os.close(os.open(target, os.O_RDWR)))}
    with open(proof, "w") as f:
        json.dump(seen, f)
'''

LINKED_SOURCE = 'VALUE = "clean"\n' + "# padding\n" * 200

RUN_TAMPER = r'''
import json, os, sysconfig
import sbxlinked
site = sysconfig.get_paths()["purelib"]
target = os.path.join(site, "sbxlinked", "__init__.py")
def attempt(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno
def append():
    with open(target, "a") as f:
        f.write("\nPWNED = True\n")
print(json.dumps({
    "value": sbxlinked.VALUE, "target": target, "uid": os.getuid(),
    "proof": json.load(open(os.path.join(site, "sbxlink_proof.json"))),
    "append": attempt(append), "truncate": attempt(lambda: os.truncate(target, 0)),
    "chmod": attempt(lambda: os.chmod(target, 0o666)),
    "open_rw": attempt(lambda: os.close(os.open(target, os.O_RDWR))),
}))
'''


# See: issue 12 (2): uv copied every file ("Failed to hardlink files": uv's cache and the build
# directory were two mounts in the install sandbox).
async def test_environments_hard_link_uvs_cache_and_no_caller_code_writes_through_the_links(snakebox_bin, tmp_path, index):
    index.add(wheel_bytes("sbxlinked", "1.0", {
        "sbxlinked/__init__.py": LINKED_SOURCE,
        "sbxlinked_hook.pth": "import _sbxlink_boot\n",
        "_sbxlink_boot.py": LINK_BOOT,
    }))
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index) as client:
        # The package's code runs when the environment is compiled, after its first run.
        first, text, is_error = await run(client, "import sbxlinked", ["sbxlinked==1.0"])
        assert not is_error and first["status"] == "ok", text
        await compiled(client)
        data, text, is_error = await run(client, RUN_TAMPER, ["sbxlinked==1.0"])
        assert not is_error and data["status"] == "ok", text
        seen = json.loads(data["stdout"])
        again, text, is_error = await run(client, "import sbxlinked; print(sbxlinked.VALUE)", ["sbxlinked==1.0"])
        assert not is_error and again["stdout"] == "clean\n" and again["environment_reused"] is True, text
    print("hard links:", json.dumps(seen))
    # Proof of life: the package's code ran while compiling, and the run imported it.
    assert seen["value"] == "clean"
    proof = seen["proof"]
    # The installed module is a hard link into uv's cache (judged from outside).
    installed = Path(seen["target"])
    assert installed.is_file()
    info = installed.stat()
    assert info.st_nlink > 1, "the environment's file is a copy, not a hard link"
    cached = [p for p in find_in_cache(data_dir, "sbxlinked/__init__.py")]
    assert any(p.stat().st_ino == info.st_ino and p.stat().st_dev == info.st_dev for p in cached), cached
    # Owned by the downloader's uid, writable by nobody else; no code ever ran as that uid.
    assert info.st_uid == INSTALLER_UID and info.st_mode & 0o022 == 0, oct(info.st_mode)
    assert proof["uid"] not in (0, INSTALLER_UID) and seen["uid"] not in (0, INSTALLER_UID)
    # Package code saw the link too (its owner shows as the overflow uid in its namespace).
    assert proof["nlink"] > 1, proof
    # Package code (compile step): write, truncate, chmod and open for writing all fail.
    assert proof["append"] == 13 and proof["truncate"] == 13 and proof["open_rw"] == 13, proof
    assert proof["chmod"] == 1, proof
    # A run: the same, on a read-only environment.
    for key in ("append", "truncate", "chmod", "open_rw"):
        assert seen[key] in (13, 1, 30), (key, seen)
    # The cache's file (and so every environment sharing it) is unchanged.
    for path in cached:
        assert path.read_text() == LINKED_SOURCE
        assert path.stat().st_mode & 0o022 == 0


# ---------------------------------------------------------------------------------------------
# Issue 19: a first run does not wait for bytecode; the environment is compiled afterwards, on
# a copy no run can write to, and published compiled in its place.
# ---------------------------------------------------------------------------------------------

# A `.pth` line that, only while its environment is writable (compiled, as package code),
# waits for a child carrying the marker (started with -S: it runs no `.pth` itself); the test
# kills that child to let the compilation go on. Runs (read-only) pass straight through.
DEFER_GATE = """
import os, subprocess, sys
if os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    subprocess.run([sys.executable, "-S", "-c", "import time; time.sleep(600)", {marker!r}])
"""

# A run that tries to leave bytecode (and a `.pth`) in its environment for later runs.
PLANT = r'''
import importlib.util, json, os, sysconfig
import sbxdefer
site = sysconfig.get_paths()["purelib"]
cached = importlib.util.cache_from_source(sbxdefer.__file__)
def attempt(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno
def plant_pyc():
    os.makedirs(os.path.dirname(cached), exist_ok=True)
    with open(cached, "wb") as f:
        f.write(b"TOKEN")
def plant_pth():
    with open(os.path.join(site, "TOKEN.pth"), "w") as f:
        f.write("import os\n")
print(json.dumps({"value": sbxdefer.VALUE, "cached": cached, "had_pyc": os.path.exists(cached),
                  "plant_pyc": attempt(plant_pyc), "plant_pth": attempt(plant_pth)}))
'''

LOADS_PYC = """
import importlib.util, os, sbxdefer
print(sbxdefer.VALUE, os.path.exists(importlib.util.cache_from_source(sbxdefer.__file__)))
"""


async def test_a_first_run_does_not_wait_for_bytecode_and_runs_cannot_plant_any(snakebox_bin, tmp_path, index):
    marker = f"sbx-defer-{secrets.token_hex(8)}"
    token = f"PLANTED{secrets.token_hex(8)}"
    index.add(wheel_bytes("sbxdefer", "1.0", {
        "sbxdefer/__init__.py": 'VALUE = "deferred"\n' + "X = 1\n" * 300,
        "sbxdefer_gate.pth": "import _sbxdefer_gate\n",
        "_sbxdefer_gate.py": DEFER_GATE.format(marker=marker),
    }))
    plant = PLANT.replace("TOKEN", token)
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index) as client:
        first, text, is_error = await run(client, plant, ["sbxdefer==1.0"])
        assert not is_error and first["status"] == "ok" and first["environment_reused"] is False, text
        seen_first = json.loads(first["stdout"])
        # The result came back before the environment was compiled: it is published, verified,
        # marked not compiled, and holds no bytecode (judged from outside).
        env, manifest = published(data_dir, "sbxdefer==1.0")
        assert manifest["verified"] is True and manifest["compiled"] is False, manifest
        assert seen_first["value"] == "deferred" and seen_first["had_pyc"] is False
        assert not list(env.glob("lib/python*/site-packages/sbxdefer/__pycache__"))
        # The compilation runs after the call, as package code (its `.pth` waits at the gate).
        await wait_for(lambda: marker_pids(marker), 120, "the compilation to run the package's .pth")
        state = await compilation(client)
        assert state["deferred"] is True and state["pending"] == 1 and state["completed"] == 0, state
        # A run while the environment is being compiled: the same published environment,
        # read-only; nothing it writes reaches the environment or the copy being compiled.
        during, text, is_error = await run(client, plant, ["sbxdefer==1.0"])
        assert not is_error and during["status"] == "ok" and during["environment_reused"] is True, text
        seen_during = json.loads(during["stdout"])
        print("plant attempts:", seen_first, seen_during)
        for seen in (seen_first, seen_during):
            assert seen["plant_pyc"] in (13, 30) and seen["plant_pth"] in (13, 30), seen
        for pid in marker_pids(marker):
            os.kill(pid, 9)
        state = await compiled(client)
        # Published compiled in the environment's place (same key, a new build).
        env_after, after = published(data_dir, "sbxdefer==1.0")
        assert env_after == env and after["compiled"] is True and after["verified"] is True, after
        assert after["build_id"] != manifest["build_id"] and after["packages"] == manifest["packages"]
        assert builds_left(data_dir) == []
        [pyc] = list(env.glob("lib/python*/site-packages/sbxdefer/__pycache__/__init__.*.pyc"))
        assert pyc == Path(seen_first["cached"]) and pyc.stat().st_uid == 0 and pyc.stat().st_mode & 0o022 == 0
        # Nothing a run wrote is in the environment.
        for root, _dirs, files in os.walk(env):
            for name in files:
                path = Path(root) / name
                assert token not in name and token.encode() not in path.read_bytes(), path
        # A later run loads the compiled module.
        later, text, is_error = await run(client, LOADS_PYC, ["sbxdefer==1.0"])
        assert not is_error and later["stdout"] == "deferred True\n" and later["environment_reused"] is True, text


# See: issue 19 (first runs): every new environment was installed online, uv revalidating each
# index page and wheel it had cached (most of the install's time when all is in uv's cache).
async def test_a_pinned_set_in_uvs_cache_is_installed_without_asking_the_index(snakebox_bin, tmp_path, index):
    index.add(wheel_bytes("sbxoffline", "1.0", {"sbxoffline/__init__.py": 'VALUE = "one"\n'}))
    index.add(wheel_bytes("sbxoffline", "2.0", {"sbxoffline/__init__.py": 'VALUE = "two"\n'}))
    data_dir = fresh(tmp_path, "data")
    script = "import sbxoffline; print(sbxoffline.VALUE)"

    def asked() -> list[str]:
        return [path for path, _ in index.requests if "sbxoffline" in path]

    async def installs(deps: list[str], expected: str) -> list[str]:
        """The index requests a first run of `deps` made (it must build a new environment)."""
        before = len(asked())
        result, text, is_error = await run(client, script, deps)
        assert not is_error and result["status"] == "ok" and result["stdout"] == expected, text
        assert result["environment_reused"] is False, result
        return asked()[before:]

    async with server(snakebox_bin, data_dir, index) as client:
        # Nothing cached yet: the index is asked for the page and the wheel.
        first = await installs(["sbxoffline==1.0"], "one\n")
        assert any(path.startswith("/simple/") for path in first), first
        assert any(path.startswith("/files/sbxoffline-1.0") for path in first), first
        # Another pinned set (another environment) of what uv has cached: not a request.
        assert await installs(["sbxoffline==1.0; platform_machine != 'sbx'"], "one\n") == []
        # A pinned version uv has not cached is fetched online, as before.
        fetched = await installs(["sbxoffline==2.0"], "two\n")
        assert any(path.startswith("/files/sbxoffline-2.0") for path in fetched), fetched
        # An unpinned set asks the index (a newer version may be there), cached or not.
        assert any(path.startswith("/simple/") for path in await installs(["sbxoffline>=1.0"], "two\n"))

        # A session's install follows the same rule.
        created, text, is_error = await call(client, "create_session")
        assert not is_error, text
        session = created["session_id"]
        # (The session's interpreter keeps what it imported: the version is read from disk.)
        version = "import importlib.metadata as m; print(m.version('sbxoffline'))"
        for packages, expected, asks in ((["sbxoffline==1.0"], "1.0\n", False), (["sbxoffline>=2.0"], "2.0\n", True)):
            before = len(asked())
            data, text, _ = await call(client, "install_packages", session_id=session, packages=packages, wait_seconds=120)
            assert data["state"] == "succeeded", text
            ran, text, _ = await call(client, "execute_python", session_id=session, script=version)
            assert ran["status"] == "ok" and ran["stdout"] == expected, text
            assert bool(asked()[before:]) == asks, (packages, asked()[before:])


# ---------------------------------------------------------------------------------------------
# Item 1: a damaged environment is never published, and a later call builds it afresh.
# ---------------------------------------------------------------------------------------------

CORRUPT_SOURCE = 'VALUE = "intact"\n' + "# body of the module\n" * 100


# See: issue 12 (1): an environment with a truncated file was published and reused until
# pruning.
async def test_a_damaged_file_in_uvs_cache_is_refused_then_rebuilt_afresh(snakebox_bin, tmp_path, index):
    index.add(wheel_bytes("sbxcorrupt", "1.0", {"sbxcorrupt/__init__.py": CORRUPT_SOURCE}))
    index.add(wheel_bytes("sbxcompanion", "1.0", {"sbxcompanion/__init__.py": "X = 1\n"}))
    data_dir = fresh(tmp_path, "data")
    script = "import sbxcorrupt, sbxcompanion; print(sbxcorrupt.VALUE)"
    async with server(snakebox_bin, data_dir, index) as client:
        first, text, is_error = await run(client, "import sbxcorrupt; print(sbxcorrupt.VALUE)", ["sbxcorrupt==1.0"])
        assert not is_error and first["stdout"] == "intact\n", text
        # The cached copy is damaged from outside (a short write, as on a full disk).
        cached = find_in_cache(data_dir, "sbxcorrupt/__init__.py")
        assert cached, "the wheel is not in uv's cache"
        for path in cached:
            os.truncate(path, 20)
        before = environments(data_dir)
        broken, text, is_error = await run(client, script, ["sbxcorrupt==1.0", "sbxcompanion==1.0"])
        error = broken.get("error") or {}
        print("damaged:", json.dumps(error)[:800])
        assert is_error and broken["status"] == "setup_failed", text
        assert "Failed to verify the new environment" in error.get("message", ""), error
        assert "sbxcorrupt/__init__.py" in error.get("message", ""), error
        assert "call again" in (error.get("hint") or ""), error
        # Nothing published, nothing left in the build directory.
        assert environments(data_dir) == before
        assert builds_left(data_dir) == []
        # The cause is gone (the damaged copy left uv's cache): the same call builds afresh.
        again, text, is_error = await run(client, script, ["sbxcorrupt==1.0", "sbxcompanion==1.0"])
        assert not is_error and again["status"] == "ok" and again["stdout"] == "intact\n", text
        assert again["environment_reused"] is False
        assert len(environments(data_dir)) == len(before) + 1


# A `.pth` line that runs while the environment is compiled: it compiles its own module first
# and truncates the compiled file after its header, the file a short write leaves on a full
# disk (compileall takes it as up to date; imports fail with `marshal data too short`).
TRUNCATE_PYC_BOOT = r'''
import os, py_compile
site = os.path.dirname(os.path.abspath(__file__))
source = os.path.join(site, "sbxpyc", "__init__.py")
if os.access(site, os.W_OK):
    compiled = py_compile.compile(source)
    os.truncate(compiled, 40)
'''


async def test_a_truncated_compiled_file_is_refused(snakebox_bin, tmp_path, index):
    """The environment is published before its bytecode (its first run imports from source);
    the compiled copy made afterwards holds a `.pyc` cut short and is refused: never
    published, the environment stays as it was, and runs go on working."""
    index.add(wheel_bytes("sbxpyc", "1.0", {
        "sbxpyc/__init__.py": 'VALUE = "compiled"\n' + "X = [%s]\n" % ", ".join(str(i) for i in range(2000)),
        "sbxpyc_hook.pth": "import _sbxpyc_boot\n",
        "_sbxpyc_boot.py": TRUNCATE_PYC_BOOT,
    }))
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index) as client:
        await run(client, "print('warm')", [])
        data, text, is_error = await run(client, "import sbxpyc; print(sbxpyc.VALUE)", ["sbxpyc==1.0"])
        assert not is_error and data["status"] == "ok" and data["stdout"] == "compiled\n", text
        env, before = published(data_dir, "sbxpyc==1.0")
        state = await compilations_ended(client, 1)
        print("truncated pyc:", json.dumps(state)[:800])
        assert state["failed"] == 1 and state["completed"] == 0, state
        assert "Failed to verify the new environment" in state["last_failure"], state
        assert "sbxpyc/__pycache__/__init__." in state["last_failure"], state
        # Nothing published in its place, no copy left, no bytecode in the environment.
        env_after, after = published(data_dir, "sbxpyc==1.0")
        assert env_after == env and after == before and after["compiled"] is False, after
        assert not list(env.glob("lib/python*/site-packages/sbxpyc/__pycache__"))
        assert builds_left(data_dir) == []
        # The environment serves the next call.
        ok, text, is_error = await run(client, "import sbxpyc; print(sbxpyc.VALUE)", ["sbxpyc==1.0"])
        assert not is_error and ok["stdout"] == "compiled\n" and ok["environment_reused"] is True, text


# ---------------------------------------------------------------------------------------------
# Items 1 and 7: a build that runs out of space says so, keeps nothing, and works once there
# is room again.
# ---------------------------------------------------------------------------------------------

BIG_MIB = 20


def big_wheel() -> tuple[str, bytes]:
    # A module of ~20 MiB of distinct string constants, whose compiled file is about as large:
    # installed (linked from uv's cache) it fits in the small data directory, compiled it does
    # not.
    body = 'VALUE = "big"\n' + "".join(f"S{i} = {os.urandom(2048).hex()!r}\n" for i in range(BIG_MIB * 256))
    return wheel_bytes("sbxbig", "1.0", {"sbxbig/__init__.py": body})


@contextlib.contextmanager
def small_tmpfs(path: Path, size_mib: int):
    path.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mib}m,mode=755", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)
        path.rmdir()


async def test_a_build_that_runs_out_of_space_says_so_and_works_once_there_is_room(snakebox_bin, tmp_path, index):
    """Installed (hard links into uv's cache) the package fits, compiled it does not: the first
    run is served from the environment published before its bytecode, and the compiled copy
    made afterwards runs out of space: discarded, reported as a lack of space, nothing left.
    Once there is room, the next server compiles it."""
    index.add(big_wheel())
    script = "import sbxbig; print(sbxbig.VALUE, len(sbxbig.S0))"
    with small_tmpfs(tmp_path / "data", 36) as data_dir:
        async with server(snakebox_bin, data_dir, index, "--sessions-max-disk", "16MiB") as client:
            await run(client, "print('warm')", [])
            df = subprocess.run(["df", "-h", str(data_dir)], capture_output=True, text=True).stdout
            data, text, is_error = await run(client, script, ["sbxbig==1.0"], timeout=180)
            assert not is_error and data["status"] == "ok" and data["stdout"] == "big 4096\n", text
            state = await compilations_ended(client, 1)
            print("disk full:", df, json.dumps(state)[:1500])
            assert state["failed"] == 1, state
            assert "out of space" in state["last_failure"], state
            env, manifest = published(data_dir, "sbxbig==1.0")
            assert manifest["compiled"] is False
            assert builds_left(data_dir) == []
            again, text, is_error = await run(client, script, ["sbxbig==1.0"], timeout=180)
            assert not is_error and again["stdout"] == "big 4096\n" and again["environment_reused"] is True, text
        # Room again: the next server compiles the environment after its next use.
        subprocess.run(["mount", "-o", "remount,size=160m", str(data_dir)], check=True)
        async with server(snakebox_bin, data_dir, index, "--sessions-max-disk", "16MiB") as client:
            again, text, is_error = await run(client, script, ["sbxbig==1.0"], timeout=180)
            assert not is_error and again["stdout"] == "big 4096\n" and again["environment_reused"] is True, text
            await compiled(client)
            env, manifest = published(data_dir, "sbxbig==1.0")
            assert manifest["compiled"] is True
            assert list(env.glob("lib/python*/site-packages/sbxbig/__pycache__/__init__.*.pyc"))


# See: issue 12 (7): space errors in `install_packages`/`create_session` were told to "check the
# package names and versions". A tenant's share of the sessions' disk is an image of its own
# (on stdio the one tenant's is the whole `--sessions-max-disk`).
async def test_session_installs_that_run_out_of_space_say_so(snakebox_bin, tmp_path, index):
    index.add(big_wheel())
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index, "--sessions-max-disk", "16MiB") as client:
        created, text, is_error = await call(client, "create_session", dependencies=["sbxbig==1.0"])
        error = created.get("error") or {}
        print("create_session:", json.dumps(error)[:1200])
        assert is_error, text
        assert "out of space" in error.get("message", ""), error
        assert "--sessions-max-disk" in (error.get("hint") or "") and "package names" not in (error.get("hint") or ""), error

        created, text, is_error = await call(client, "create_session")
        assert not is_error, text
        session = created["session_id"]
        data, text, is_error = await call(client, "install_packages", session_id=session, packages=["sbxbig==1.0"], wait_seconds=240)
        error = data.get("error") or {}
        print("install_packages:", json.dumps(error)[:1200])
        assert data["state"] == "failed", text
        assert "out of space" in error.get("message", ""), error
        hint = error.get("hint") or ""
        assert "--sessions-max-disk" in hint and "package names" not in hint and "TLS" not in hint, error
        # The damaged compiled file was removed: the session runs, and imports the package
        # (compiled in memory) instead of failing with `marshal data too short`.
        ran, text, _ = await call(client, "execute_python", session_id=session, script="import sbxbig; print(sbxbig.VALUE)")
        assert ran["status"] == "ok" and ran["stdout"] == "big\n", text


# See: issue 12 (1): an environment published broken (before environments were verified) was
# reused until pruning. One without the manifest's `verified` mark is rebuilt at its next use.
async def test_an_environment_published_before_verification_is_rebuilt_not_reused(snakebox_bin, tmp_path, index):
    index.add(wheel_bytes("sbxold", "1.0", {"sbxold/__init__.py": 'VALUE = "old"\n' + "X = 1\n" * 300}))
    data_dir = fresh(tmp_path, "data")
    script = "import sbxold; print(sbxold.VALUE)"
    async with server(snakebox_bin, data_dir, index) as client:
        first, text, is_error = await run(client, script, ["sbxold==1.0"])
        assert not is_error and first["stdout"] == "old\n", text
        await compiled(client)
    # From outside: make it look like an environment of an earlier version, published with a
    # truncated compiled file (what a full disk left).
    [env] = [p for p in (data_dir / "environments-v1").iterdir()
             if json.loads((p / "snakebox-env.json").read_text())["requirements"] == ["sbxold==1.0"]]
    manifest_path = env / "snakebox-env.json"
    manifest = json.loads(manifest_path.read_text())
    manifest.pop("verified", None)
    manifest_path.chmod(0o644)
    manifest_path.write_text(json.dumps(manifest))
    [pyc] = list(env.glob("lib/python*/site-packages/sbxold/__pycache__/__init__.*.pyc"))
    os.truncate(pyc, 40)
    async with server(snakebox_bin, data_dir, index) as client:
        again, text, is_error = await run(client, script, ["sbxold==1.0"])
        assert not is_error and again["status"] == "ok" and again["stdout"] == "old\n", text
        assert again["environment_reused"] is False
        # Rebuilt and verified: reused from now on.
        third, text, is_error = await run(client, script, ["sbxold==1.0"])
        assert not is_error and third["environment_reused"] is True, text


# See: issue 12 (7): every uv error carried uv's deprecation warning for `UV_NATIVE_TLS` (set by
# snakebox when the client starts it with a stripped environment), and it was read as a TLS
# error.
async def test_uv_errors_carry_no_deprecation_warning_and_get_no_tls_hint(snakebox_bin, tmp_path, index):
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index) as client:
        data, text, is_error = await run(client, "print('RAN')", ["sbxnosuchpackage==1.0"])
        ok, _, _ = await run(client, "print('alive')", [])
    error = data.get("error") or {}
    print("unknown package:", json.dumps(error)[:800])
    assert is_error and data["status"] == "setup_failed" and "RAN" not in (data.get("stdout") or ""), text
    assert "sbxnosuchpackage" in error.get("message", ""), error
    assert "deprecated" not in error.get("message", "") and "UV_NATIVE_TLS" not in error.get("message", ""), error
    assert "TLS" not in (error.get("hint") or ""), error
    assert ok["stdout"] == "alive\n"


# See: issue 12 (1): a session install is checked too: a damaged file copied from uv's cache
# is reported by the install, not by an import later.
async def test_a_session_install_of_a_damaged_cached_file_is_reported(snakebox_bin, tmp_path, index):
    index.add(wheel_bytes("sbxsesscorrupt", "1.0", {"sbxsesscorrupt/__init__.py": CORRUPT_SOURCE}))
    data_dir = fresh(tmp_path, "data")
    async with server(snakebox_bin, data_dir, index) as client:
        first, text, is_error = await run(client, "import sbxsesscorrupt; print(sbxsesscorrupt.VALUE)", ["sbxsesscorrupt==1.0"])
        assert not is_error and first["stdout"] == "intact\n", text
        cached = find_in_cache(data_dir, "sbxsesscorrupt/__init__.py")
        assert cached, "the wheel is not in uv's cache"
        for path in cached:
            os.truncate(path, 20)
        created, text, is_error = await call(client, "create_session")
        assert not is_error, text
        data, text, _ = await call(client, "install_packages", session_id=created["session_id"], packages=["sbxsesscorrupt==1.0"], wait_seconds=240)
        error = data.get("error") or {}
        print("session install:", json.dumps(error)[:800])
        assert data["state"] == "failed", text
        assert "damaged or missing" in error.get("message", "") and "sbxsesscorrupt/__init__.py" in error.get("message", ""), error
        assert "reset_session" in (error.get("hint") or ""), error
        assert "copies in uv's cache were removed" in error.get("message", ""), error
        assert not find_in_cache(data_dir, "sbxsesscorrupt/__init__.py")
        # The cause is gone: a new session installs it intact.
        created, text, is_error = await call(client, "create_session", dependencies=["sbxsesscorrupt==1.0"])
        assert not is_error, text
        ran, text, _ = await call(client, "execute_python", session_id=created["session_id"], script="import sbxsesscorrupt; print(sbxsesscorrupt.VALUE)")
        assert ran["status"] == "ok" and ran["stdout"] == "intact\n", text
