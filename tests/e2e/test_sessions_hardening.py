"""Sessions and the service around the sandbox, attacked (issue 10, catalogue section 3b):
S-01 caller-built trees, S-03 session network, V-01 every sandbox kind in the concurrency
caps, S-04 session result integrity.

Every test runs the attack through the real binary over MCP, shows that the attack ran (proof
of life: what the session's code built or printed), and judges the outcome from outside (the
host directory, host /proc, listeners on host loopback, the server still answering).
"""

from __future__ import annotations

import os
import subprocess
import uuid
from pathlib import Path

import pytest

from conftest import call, connect, docker_backend, have_bwrap, server_pid, session_dir, session_dirs
from http_support import free_port

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]


def fresh_data_dir(tmp_path: Path) -> Path:
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    return data_dir


async def create(client, **arguments) -> str:
    data, text, is_error = await call(client, "create_session", **arguments)
    assert not is_error, text
    return data["session_id"]


async def cell(client, session: str, script: str, **arguments) -> tuple[dict, str, bool]:
    return await call(client, "execute_python", script=script, session_id=session, **arguments)


async def alive(client) -> None:
    """Proof that the server still answers, and can still run code."""
    data, text, _ = await call(client, "execute_python", script="print(6 * 7)")
    assert data["status"] == "ok" and data["stdout"] == "42\n", text


# --- S-01: caller-built trees ---------------------------------------------------------------

# A directory chain 20 000 deep (built relative to descriptors: its path is far longer than
# PATH_MAX), plus 100 000 empty files in 100 directories, plus links to the host's /etc.
BUILD_TREE = """
import os
top = os.open('.', os.O_RDONLY | os.O_DIRECTORY)
os.mkdir('deep', dir_fd=top)
fd = os.open('deep', os.O_RDONLY | os.O_DIRECTORY, dir_fd=top)
for i in range(20000):
    os.mkdir('d', dir_fd=fd)
    nxt = os.open('d', os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
    os.close(fd)
    fd = nxt
os.symlink('/etc', 'etc-link', dir_fd=fd)
os.close(fd)
os.mkdir('wide')
for d in range(100):
    base = f'wide/{d:03d}'
    os.mkdir(base)
    for f in range(1000):
        os.close(os.open(f'{base}/{f:04d}', os.O_CREAT | os.O_WRONLY, 0o644))
os.symlink('/etc', 'etc-link')
print('built', sum(len(files) for _, _, files in os.walk('wide')))
"""


def host_work(data_dir: Path, session: str) -> Path:
    return session_dir(data_dir, session) / "work"


async def test_S01_deep_and_wide_trees_never_crash_the_server(snakebox_bin, tmp_path):
    data_dir = fresh_data_dir(tmp_path)
    canary = tmp_path / "canary"
    canary.mkdir()
    (canary / "keep").write_text("canary")
    async with connect(snakebox_bin, data_dir, "auto") as client:
        pid = server_pid(data_dir)
        session = await create(client)
        other = await create(client)
        await cell(client, other, "open('mine.txt', 'w').write('other')")
        data, text, _ = await cell(client, session, BUILD_TREE, timeout_seconds=240)
        # Proof of life: the tree exists, as the session's code built it, on the host.
        assert data["status"] == "ok" and data["stdout"] == "built 100000\n", text
        work = host_work(data_dir, session)
        assert (work / "deep" / "d" / "d").is_dir() and len(os.listdir(work / "wide" / "000")) == 1000
        # Artifact collection met the tree: bounded, and it says so.
        assert any("partial" in note or "more than" in note for note in data["notes"]), data["notes"]
        # A link to a host canary planted at depth 20 000 too.
        await cell(client, session, f"import os; os.symlink({str(canary)!r}, 'canary-link')")

        # Listing: bounded, answered, flagged as truncated.
        listing, text, is_error = await call(client, "list_files", session_id=session, path="", depth=10)
        assert not is_error, text
        assert listing["truncated"] is True
        assert any(entry["path"] == "deep/d" for entry in listing["entries"])
        assert {"path": "etc-link", "kind": "symlink", "size": 0} in listing["entries"]
        # Disk usage (measured after every call) is answered.
        sessions, text, _ = await call(client, "list_sessions")
        assert session in {s["session_id"] for s in sessions["sessions"]}, text

        # Reset walks and removes the whole tree: the workspace is empty afterwards.
        data, text, is_error = await call(client, "reset_session", session_id=session)
        assert not is_error, text
        assert not (work / "deep").exists() and not (work / "wide").exists()
        data, text, _ = await cell(client, session, "import os; print(sorted(os.listdir('.')))")
        assert data["stdout"] == "[]\n", text

        # Build it again, then delete the session: the host directory is gone.
        data, text, _ = await cell(client, session, BUILD_TREE, timeout_seconds=240)
        assert data["stdout"] == "built 100000\n", text
        data, text, is_error = await call(client, "delete_session", session_id=session)
        assert not is_error, text
        assert not session_dirs(data_dir, session)

        # The server is the same process, answers, and nothing outside was touched.
        assert server_pid(data_dir) == pid
        await alive(client)
        assert (canary / "keep").read_text() == "canary"
        assert (host_work(data_dir, other) / "mine.txt").read_text() == "other"
        assert (Path("/etc") / "passwd").exists()


async def test_S01_the_idle_reaper_deletes_a_deep_tree_and_the_server_lives(snakebox_bin, tmp_path):
    import anyio

    data_dir = fresh_data_dir(tmp_path)
    flags = ("--session-idle-stop", "2", "--session-idle-delete", "3")
    script = BUILD_TREE.replace("range(100)", "range(1)")
    async with connect(snakebox_bin, data_dir, "auto", *flags) as client:
        pid = server_pid(data_dir)
        session = await create(client)
        data, text, _ = await cell(client, session, script, timeout_seconds=240)
        assert data["stdout"] == "built 1000\n", text
        assert (host_work(data_dir, session) / "deep" / "d").is_dir()
        for _ in range(120):
            if not session_dirs(data_dir, session):
                break
            await anyio.sleep(0.5)
        assert not session_dirs(data_dir, session)
        listed, _, _ = await call(client, "list_sessions")
        assert session not in {s["session_id"] for s in listed["sessions"]}
        assert server_pid(data_dir) == pid
        await alive(client)


async def test_S01_a_one_shot_run_leaving_a_deep_tree_is_cleaned_up(snakebox_bin, tmp_path):
    data_dir = fresh_data_dir(tmp_path)
    script = BUILD_TREE.replace("range(100)", "range(5)")
    async with connect(snakebox_bin, data_dir, "auto", "--scratch-limit", "512MiB") as client:
        pid = server_pid(data_dir)
        data, text, _ = await call(client, "execute_python", script=script, timeout_seconds=240)
        assert data["status"] == "ok" and data["stdout"] == "built 5000\n", text
        assert len(data["artifacts"]) <= 100
        assert server_pid(data_dir) == pid
        await alive(client)
    runs = data_dir / "runs"
    # runs/<server pid>/ stays (removed by the next start); no run directory is left in it.
    left = list(runs.glob("*/*")) if runs.exists() else []
    assert not left, left[:5]


# --- S-03: session network ------------------------------------------------------------------

CONNECT = """
import socket, urllib.request
try:
    urllib.request.urlopen('http://127.0.0.1:{port}/', timeout=5)
except Exception as err:
    print('proxy' if 'HTTP_PROXY' in __import__('os').environ else 'no proxy', type(err).__name__)
s = socket.socket()
s.settimeout(3)
try:
    s.connect(('127.0.0.1', {port}))
    print('connected')
except OSError as err:
    print('refused', err.errno)
"""


async def test_S03_sessions_follow_the_one_shot_network_rules(snakebox_bin, tmp_path):
    import errno

    from attacks_support import Listener

    port = free_port()
    listener = Listener(__import__("socket").AF_INET, ("127.0.0.1", port), "tcp4")
    try:
        async with connect(snakebox_bin, fresh_data_dir(tmp_path), "auto", "--network", "on") as client:
            # Declined at creation: no network for the session's code nor its commands.
            offline, text, is_error = await call(client, "create_session", network=False)
            assert not is_error and offline["network"] is False, text
            assert "network: off" in text
            data, text, _ = await cell(client, offline["session_id"], CONNECT.format(port=port))
            assert data["status"] == "ok" and data["stdout"] == f"no proxy URLError\nrefused {errno.ECONNREFUSED}\n", text
            assert data["network_log"] == []
            await call(client, "write_file", session_id=offline["session_id"], path="probe.py",
                       content=CONNECT.format(port=port))
            command, text, _ = await call(client, "run_command", session_id=offline["session_id"],
                                          command="python probe.py")
            assert command["status"] == "ok" and "refused" in command["stdout"], text
            assert listener.connections == []
            # A call cannot take network the session was created without.
            data, text, is_error = await cell(client, offline["session_id"], "print(1)", network=True)
            assert is_error and data["status"] == "invalid_request", text
            assert "created without network" in data["error"]["message"], text

            # The default on this server is network, as for one-shot runs: the session's code
            # has the proxy (proof that the refusal above was the session's policy), and the
            # proxy never reaches the host's loopback either (issue 13): its own namespace
            # refuses the direct connection, the proxy the address, and the log says why.
            online, text, is_error = await call(client, "create_session")
            assert not is_error and online["network"] is True, text
            data, text, _ = await cell(client, online["session_id"], CONNECT.format(port=port))
            assert data["stdout"] == f"proxy HTTPError\nrefused {errno.ECONNREFUSED}\n", text
            assert [(e["host"], e["allowed"]) for e in data["network_log"]] == [("127.0.0.1", False)], text
            assert "IP address" in data["network_log"][0]["reason"]
            assert listener.connections == []
            # A call cannot drop it for one cell either: refused with the reason.
            data, text, is_error = await cell(client, online["session_id"], "print(1)", network=False)
            assert is_error and data["status"] == "invalid_request", text
            assert "created with network" in data["error"]["message"], text
            listed, _, _ = await call(client, "list_sessions")
            policy = {s["session_id"]: s["network"] for s in listed["sessions"]}
            assert policy == {offline["session_id"]: False, online["session_id"]: True}

        # The same data directory under a server without network: the session created with
        # network has none now, and its result says so.
        async with connect(snakebox_bin, tmp_path / "data", "auto") as client:
            listed, _, _ = await call(client, "list_sessions")
            assert all(s["network"] is False for s in listed["sessions"]), listed
            data, text, _ = await cell(client, online["session_id"], CONNECT.format(port=port))
            assert data["stdout"] == f"no proxy URLError\nrefused {errno.ECONNREFUSED}\n", text
            assert any("does not allow network now" in note for note in data["notes"]), data["notes"]
            assert listener.connections == []
            # Asking for more than the server allows is refused, at creation and per call.
            data, text, is_error = await call(client, "create_session", network=True)
            assert is_error and "--network on" in data["error"]["hint"], text
            data, text, is_error = await cell(client, offline["session_id"], "print(1)", network=True)
            assert is_error and "--network on" in data["error"]["hint"], text
            default, text, _ = await call(client, "create_session")
            assert default["network"] is False, text
            await alive(client)
    finally:
        listener.close()


# --- V-01: every sandbox kind counts in the concurrency caps --------------------------------


class SandboxCounter:
    """Counts the server's live sandboxes from outside, in host /proc: its `bwrap` children
    (native), or the containers whose processes sit in its cgroups (docker: each container's
    cgroup is below `/snakebox-docker/<server>/<container>`, the server named by its pid
    namespace, pid and start time, as the engine's `snakebox.server` label)."""

    def __init__(self, server: int) -> None:
        import threading

        self.server = server
        with open(f"/proc/{server}/stat") as f:
            start = f.read().rsplit(")", 1)[1].split()[19]
        self.docker_parent = f"/snakebox-docker/{os.stat('/proc/self/ns/pid').st_ino}.{server}.{start}/"
        self.max_alive = 0
        self.seen: set[int | str] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _alive(self) -> list[int | str]:
        if docker_backend():
            return self._containers()
        alive: list[int | str] = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            comm = stat[stat.index("(") + 1 : stat.rindex(")")]
            fields = stat[stat.rindex(")") + 2 :].split()
            if comm == "bwrap" and int(fields[1]) == self.server and fields[0] != "Z":
                alive.append(int(entry))
        return alive

    def _containers(self) -> list[int | str]:
        alive: set[int | str] = set()
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    with open(f"/proc/{entry}/cgroup") as f:
                        cgroups = f.read()
                except OSError:
                    continue
                for line in cgroups.splitlines():
                    if self.docker_parent in line:
                        alive.add(line.split(self.docker_parent, 1)[1].split("/", 1)[0])
        return list(alive)

    def _loop(self) -> None:
        while not self._stop.is_set():
            alive = self._alive()
            self.seen.update(alive)
            self.max_alive = max(self.max_alive, len(alive))

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(5)


async def test_V01_every_sandbox_kind_counts_in_the_concurrency_cap(snakebox_bin, tmp_path):
    import anyio

    data_dir = fresh_data_dir(tmp_path)
    flags = ("--max-concurrent-runs", "2", "--warm-pool", "0", "--fork-server", "off")
    async with connect(snakebox_bin, data_dir, "auto", *flags) as client:
        sessions = [await create(client) for _ in range(3)]
        counter = SandboxCounter(server_pid(data_dir))
        results: dict[str, tuple] = {}

        async def validate(i: int) -> None:
            results[f"validate-{i}"] = await call(client, "validate_script", script=f"x = {i}\nprint(x\n")

        async def install(session: str) -> None:
            results[f"install-{session}"] = await call(
                client, "install_packages", session_id=session, packages=["six==1.16.0"], wait_seconds=240
            )

        async def make(i: int) -> None:
            results[f"create-{i}"] = await call(client, "create_session", name=f"v01-{i}")

        async def run(i: int) -> None:
            results[f"run-{i}"] = await call(client, "execute_python", script=f"import time; time.sleep(0.3); print({i})")

        async def build(version: str) -> None:
            # A new environment: its download and compile sandboxes hold a slot too.
            results[f"build-{version}"] = await call(
                client, "execute_python", script="import six; print(six.__version__)", dependencies=[f"six=={version}"], timeout_seconds=120
            )

        try:
            async with anyio.create_task_group() as group:
                for i in range(6):
                    group.start_soon(validate, i)
                for session in sessions:
                    group.start_soon(install, session)
                for i in range(3):
                    group.start_soon(make, i)
                for i in range(3):
                    group.start_soon(run, i)
                for version in ("1.15.0", "1.14.0"):
                    group.start_soon(build, version)
        finally:
            counter.stop()
        # Every call was answered, as it would be without the cap.
        assert len(results) == 17
        for name, (data, text, is_error) in results.items():
            if name.startswith("validate"):
                assert any(p.get("kind") == "syntax" or "line" in str(p) for p in data["problems"]), text
            elif name.startswith("install"):
                assert not is_error and data["state"] == "succeeded", text
            elif name.startswith("create"):
                assert not is_error and data["session_id"], text
            elif name.startswith("build"):
                assert data["status"] == "ok" and data["stdout"] == name.removeprefix("build-") + "\n", text
            else:
                assert data["status"] == "ok", text
        # Judged from outside: the load really ran (many sandboxes, two at once), and never
        # more than the cap at a time.
        assert len(counter.seen) >= 17, counter.seen
        assert counter.max_alive == 2, counter.max_alive
        await alive(client)


# --- S-04: session result integrity ---------------------------------------------------------

# Replaces everything a later cell's report could go through by name: sys.exit, builtins, json,
# os.write, importlib, the runners' module functions, the excepthook.
HOOKS = """
import builtins, importlib, json, os, sys
runner = sys.modules['_snakebox_runner']
session_runner = sys.modules['_snakebox_session_runner']
sys.exit = lambda *a, **k: None
builtins.exec = lambda *a, **k: None
builtins.eval = lambda *a, **k: None
json.dumps = lambda *a, **k: '{"exit_code": 0}'
json.loads = lambda *a, **k: {"code": "pass", "marker": ""}
forged = ({"exit_code": 0, "names": [], "exception": None, "value": None}, None)
runner.run_code = lambda *a, **k: forged
runner._exit_code = lambda err: 0
runner._describe_exception = lambda *a, **k: ("", None)
runner._compile = lambda *a, **k: (compile('pass', 'x', 'exec'), None)
session_runner._write_all = lambda fd, data: None
importlib.invalidate_caches = lambda: None
sys.excepthook = lambda *a: None
print('hooked')
"""

# Deliberate tampering with the runner's private references themselves: the documented limit.
TAMPER = """
import sys
sys.modules['_snakebox_runner'].run_code.__kwdefaults__['_exit_code'] = lambda err: 0
print('tampered')
"""


async def test_S04_hooks_left_by_a_cell_do_not_change_later_results(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto") as client:
        session = await create(client)
        data, text, _ = await cell(client, session, HOOKS)
        assert data["status"] == "ok" and data["stdout"] == "hooked\n", text
        # Proof the hooks are live in the interpreter: the cell's own sys.exit is a no-op now.
        data, text, _ = await cell(client, session, "import sys; sys.exit(4); print('still here')")
        assert data["stdout"] == "still here\n" and data["exit_code"] == 0, text
        # The truth of later cells.
        data, text, _ = await cell(client, session, "raise SystemExit(3)")
        assert data["status"] == "error" and data["exit_code"] == 3, text
        data, text, _ = await cell(client, session, "assert 1 == 2, 'boom'")
        assert data["status"] == "error" and data["exit_code"] == 1, text
        assert data["exception"]["type_name"] == "AssertionError" and data["exception"]["message"] == "boom"
        data, text, _ = await cell(client, session, "x = 6\nx * 7")
        assert data["status"] == "ok" and data["result"]["json"] == 42, text
        assert data["fresh_interpreter"] is False, text
        # An interpreter death is observed by the host, not reported by the runner.
        data, text, _ = await cell(client, session, "import os; os._exit(5)")
        assert data["exit_code"] == 5 and data["status"] == "error", text
        await call(client, "delete_session", session_id=session)


async def test_S04_tampering_with_the_runner_forges_only_that_sessions_own_later_cells(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto") as client:
        a = await create(client)
        b = await create(client)
        data, text, _ = await cell(client, a, TAMPER)
        assert data["stdout"] == "tampered\n", text
        # The documented limit, exactly: A's later SystemExit(3) is reported as exit 0 / ok...
        data, text, _ = await cell(client, a, "raise SystemExit(3)")
        assert (data["status"], data["exit_code"]) == ("ok", 0), text
        # ...but not B's, nor what the host observes in A: a timeout, then a fresh interpreter
        # without the tampering.
        data, text, _ = await cell(client, b, "raise SystemExit(3)")
        assert (data["status"], data["exit_code"]) == ("error", 3), text
        data, text, _ = await cell(client, a, "import time; time.sleep(30)", timeout_seconds=1)
        assert data["status"] == "timeout", text
        data, text, _ = await cell(client, a, "raise SystemExit(3)")
        assert data["fresh_interpreter"] is True and (data["status"], data["exit_code"]) == ("error", 3), text
        for session in (a, b):
            await call(client, "delete_session", session_id=session)


# --- S-02: the session disk quota holds while a call runs -----------------------------------

# Writes 16 MiB files (RLIMIT_FSIZE caps one file) until the disk refuses, for up to 512 MiB.
FILL = """
import errno, os
os.makedirs('fill', exist_ok=True)
block = b'x' * (1 << 20)
written = 0
stopped = None
for i in range(32):
    try:
        with open(f'fill/{tag}-{{i:02d}}', 'wb') as f:
            for _ in range(16):
                f.write(block)
                f.flush()
                written += 1 << 20
    except OSError as err:
        stopped = errno.errorcode.get(err.errno, err.errno)
        break
print('written', written >> 20, 'stopped', stopped)
"""


def allocated(path: Path) -> int:
    return os.stat(path).st_blocks * 512


def share_of(data_dir: Path, session: str) -> tuple[Path, Path]:
    """The image of the tenant's share of the sessions' disk that holds `session`, and where it
    is mounted (on stdio the one tenant's share is the whole --sessions-max-disk)."""
    mount = session_dir(data_dir, session).parent
    return mount.with_suffix(".img"), mount


def mounted_shares(data_dir: Path) -> list[Path]:
    shares = data_dir / "sessions-v1" / "shares"
    return [p for p in shares.iterdir() if os.path.ismount(p)] if shares.is_dir() else []


async def test_S02_one_call_cannot_write_past_the_sessions_disk_quota(snakebox_bin, tmp_path):
    data_dir = fresh_data_dir(tmp_path)
    flags = ("--sessions-max-disk", "256MiB")
    async with connect(snakebox_bin, data_dir, "auto", *flags) as client:
        report, _, _ = await call(client, "check_environment")
        assert "enforced by the kernel" in report["sessions"]["disk_quota"], report["sessions"]
        session = await create(client)
        image, _ = share_of(data_dir, session)
        before = allocated(image)
        # 160 MiB fits.
        data, text, _ = await cell(client, session, FILL.format(tag="a").replace("range(32)", "range(10)"))
        assert data["stdout"] == "written 160 stopped None\n", text
        # One call asking for 512 MiB more: refused by the kernel inside the call.
        data, text, _ = await cell(client, session, FILL.format(tag="b"))
        written = int(data["stdout"].split()[1])
        assert data["stdout"].endswith("stopped ENOSPC\n"), text
        assert 16 <= written < 96, text  # what was left of 256 MiB, less ext4's own metadata
        assert any("share of the sessions' disk is full" in note for note in data["notes"]), data["notes"]
        # Judged from outside: the host disk got at most the quota.
        assert allocated(image) <= (256 << 20), allocated(image)
        assert allocated(image) - before <= (256 << 20)
        work = host_work(data_dir, session)
        on_disk = sum(f.stat().st_size for f in (work / "fill").iterdir())
        assert on_disk == (160 + written) << 20
        # The server still answers; freeing files makes room again.
        await alive(client)
        data, text, _ = await cell(client, session, "import shutil; shutil.rmtree('fill'); print('freed')")
        assert data["stdout"] == "freed\n", text
        data, text, _ = await cell(client, session, FILL.format(tag="c").replace("range(32)", "range(4)"))
        assert data["stdout"] == "written 64 stopped None\n", text

    # After a restart, files are kept and the bound holds again.
    async with connect(snakebox_bin, data_dir, "auto", *flags) as client:
        data, text, is_error = await call(client, "list_files", session_id=session, path="fill", depth=1)
        assert not is_error and len(data["entries"]) == 4, text
        data, text, _ = await cell(client, session, FILL.format(tag="d"))
        assert data["stdout"].endswith("stopped ENOSPC\n"), text
        assert allocated(image) <= (256 << 20)
        await call(client, "delete_session", session_id=session)
        # The tenant's last session is gone: its share too (the image, its reservation).
        assert not image.exists()
    # Shares are unmounted when the last server of the data directory ends.
    assert not mounted_shares(data_dir)


async def test_S02_a_killed_server_leaves_no_mount_behind(snakebox_bin, tmp_path):
    import signal
    import time

    data_dir = fresh_data_dir(tmp_path)
    client_cm = connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB")
    client = await client_cm.__aenter__()
    try:
        session = await create(client)
        await cell(client, session, "open('kept.txt', 'w').write('kept')")
        _, mount = share_of(data_dir, session)
        assert os.path.ismount(mount)
        os.kill(server_pid(data_dir), signal.SIGKILL)
    finally:
        try:
            await client_cm.__aexit__(None, None, None)
        except Exception:  # noqa: BLE001 - the server is gone: the client's exit may complain
            pass
    # The watchdog unmounts the shares once the server is gone (SIGKILL included)...
    deadline = time.monotonic() + 10
    while os.path.ismount(mount) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not os.path.ismount(mount)
    # ...and the next start mounts them again, with the session's files.
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB") as client:
        data, text, is_error = await call(client, "read_file", session_id=session, path="kept.txt")
        assert not is_error and data["content"] == "kept", text
        assert os.path.ismount(mount)
    assert not mounted_shares(data_dir)


async def test_S02_the_image_follows_a_changed_quota_when_the_files_fit(snakebox_bin, tmp_path):
    data_dir = fresh_data_dir(tmp_path)

    def fill(tag: str, files: int) -> str:
        return FILL.format(tag=tag).replace("range(32)", f"range({files})")

    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB") as client:
        session = await create(client)
        image, mount = share_of(data_dir, session)
        data, text, _ = await cell(client, session, fill("a", 8))
        assert data["stdout"].endswith("stopped ENOSPC\n"), text  # 128 MiB asked, 64 MiB quota
        await cell(client, session, "import shutil; shutil.rmtree('fill')")
        data, text, _ = await cell(client, session, fill("b", 2))
        assert data["stdout"] == "written 32 stopped None\n", text
        # Something of this server outlives it a little inside the image (as dying
        # interpreters do): its lazy unmount is not over when the next server starts, and that
        # one must wait for it before it resizes (the old mount's last superblock write undid
        # the resize: ENOSPC at 64 MiB, seen in CI).
        holder = subprocess.Popen(["sleep", "3"], cwd=mount)
    assert image.stat().st_size == 64 << 20
    # A larger quota: the image grows (checked and resized before it is mounted).
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "160MiB") as client:
        report, _, _ = await call(client, "check_environment")
        assert "160 MiB" in report["sessions"]["disk_quota"], report["sessions"]["disk_quota"]
        data, text, _ = await cell(client, session, fill("c", 6))
        assert data["stdout"] == "written 96 stopped None\n", text  # 128 MiB in all, past 64
    assert holder.wait(timeout=10) == 0
    assert image.stat().st_size == 160 << 20
    # A quota smaller than what the files need: the image keeps its size, and says so.
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB") as client:
        report, _, _ = await call(client, "check_environment")
        assert "160 MiB" in report["sessions"]["disk_quota"], report["sessions"]["disk_quota"]
        assert report["sessions"]["tenant_max_disk_bytes"] == 160 << 20, report["sessions"]
        data, text, is_error = await call(client, "list_files", session_id=session, path="fill", depth=1)
        assert not is_error and len(data["entries"]) == 8, text
    assert image.stat().st_size == 160 << 20
    # Once the files fit (here: once they are deleted), the next start shrinks it.
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "160MiB") as client:
        data, text, _ = await cell(client, session, "import shutil; shutil.rmtree('fill'); print('freed')")
        assert data["stdout"] == "freed\n", text
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB") as client:
        report, _, _ = await call(client, "check_environment")
        assert "64 MiB" in report["sessions"]["disk_quota"], report["sessions"]["disk_quota"]
        assert report["sessions"]["tenant_max_disk_bytes"] == 64 << 20, report["sessions"]
        await alive(client)
    assert image.stat().st_size == 64 << 20


async def test_S02_a_smaller_quota_than_a_live_servers_image_is_refused_not_ignored(snakebox_bin, tmp_path):
    """Issue 32, item 8: a server started with a smaller --sessions-max-disk on a data
    directory whose image another live server holds at another size ran silently with the
    other's size. It now refuses sessions with the conflict and what to do; its one-shot runs
    and the other server are unaffected."""
    data_dir = fresh_data_dir(tmp_path)
    async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "256MiB") as first:
        session = await create(first)
        await cell(first, session, "open('kept.txt', 'w').write('kept')")
        image, _ = share_of(data_dir, session)
        assert image.stat().st_size == 256 << 20
        async with connect(snakebox_bin, data_dir, "auto", "--sessions-max-disk", "64MiB") as second:
            data, text, is_error = await call(second, "create_session")
            assert is_error and data["error"]["kind"] == "unavailable", text
            assert "256 MiB" in data["error"]["message"] and "64 MiB" in data["error"]["message"], text
            assert "--sessions-max-disk" in data["error"]["hint"], text
            # Not a server-wide failure: one-shot runs go on.
            await alive(second)
        # The first server and its session are untouched, the image its size.
        data, text, is_error = await call(first, "read_file", session_id=session, path="kept.txt")
        assert not is_error and data["content"] == "kept", text
        assert image.stat().st_size == 256 << 20
        await call(first, "delete_session", session_id=session)
