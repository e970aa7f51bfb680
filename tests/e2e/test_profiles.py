"""Profiles (issue 18): named policy bundles, each decision judged from outside.

- under `basic`, a program start is refused by the kernel (seccomp: EPERM) even when the
  script reaches `os` without importing it (the import policy is a guard rail; the sandbox is
  the boundary), on the forked and the cold launch path, while `standard` starts it;
- under `basic`, an import outside the policy is refused with its line, a package is refused
  before anything is installed, `/work` is read-only;
- a call narrows a limit (`memory_limit` below the profile's: enforced) and is refused when it
  widens one, with a hint;
- under a `network` profile, a connection to a name outside its allowlist is refused by the
  run's proxy and logged;
- the result, the audit log (`finished` lines and the `call` lines of tools that run no code)
  and `check_environment` name the profile; events are in both;
- over HTTP a tenant may name only the profiles the operator allowed it;
- a dependency's `.pth` that starts a program is refused on a cold start and in a session's
  interpreter (site runs after the exec-deny program);
- a session is held to its profile's network and packages;
- a session is held to the whole profile: under a profile that denies subprocesses a program
  started by a cell never runs (its marker file never appears in the workspace on the host;
  under `standard` it does); under `basic` the kernel refuses it (EPERM), an import outside the policy is blocked by the runtime guard, /work is read-only,
  memory is the profile's, `run_command` is refused; variables persist across cells, and the
  result, `list_sessions` and the audit log name the profile.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from conftest import call, connect, have_bwrap, session_dir

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

# Reaches `os` without an import (the classic escape from a Python-level sandbox), then starts
# a program. Without the profile's seccomp program /bin/true runs (status 0); with it the
# kernel refuses execve with EPERM (errno 1), which nothing else would give here.
SPAWN = """g = next(c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close").__init__.__globals__
print("alive")
try:
    pid = g["posix_spawn"]("/bin/true", ["/bin/true"], {})
    print("spawned", g["waitpid"](pid, 0)[1])
except OSError as err:
    print("refused", err.errno)
"""

WRITE = """try:
    open("out.txt", "w").write("x")
    print("written")
except OSError as err:
    print("refused", err.errno)
"""

CONFIG = """
[profiles.offline_tools]
description = "subprocesses denied, nothing else"
subprocesses = false

[profiles.web]
network = ["allowed.test"]
tenants = ["team-a"]
"""


def audit_lines(data: Path) -> list[dict]:
    """Every tenant's audit lines (one file each, `audit/tenants/<tenant>.jsonl`), by time."""
    lines = [json.loads(line) for path in sorted((data / "audit" / "tenants").glob("*.jsonl"))
             for line in path.read_text().splitlines()]
    return sorted(lines, key=lambda line: line["at_ms"])


@pytest.mark.parametrize("launch", ["forked", "cold"])
async def test_basic_denies_programs_imports_packages_and_writes(snakebox_bin, tmp_path, mode, launch):
    data = tmp_path / "data"
    args = ["--profile", "basic"] + (["--fork-server", "off", "--warm-pool", "0"] if launch == "cold" else [])
    async with connect(snakebox_bin, data, mode, *args) as client:
        # The same script under `standard` (named by the local operator) starts the program.
        allowed, _, _ = await call(client, "execute_python", script=SPAWN, profile="standard")
        assert allowed["status"] == "ok" and allowed["stdout"] == "alive\nspawned 0\n", allowed
        assert allowed["profile"] == "standard" and allowed["events"] == [], allowed
        denied, _, _ = await call(client, "execute_python", script=SPAWN)
        assert denied["status"] == "ok" and denied["stdout"] == "alive\nrefused 1\n", denied
        assert denied["profile"] == "basic"
        assert [e["kind"] for e in denied["events"]] == ["exec_blocked"], denied["events"]
        assert "/bin/true" in denied["events"][0]["detail"]

        imported, _, is_error = await call(client, "execute_python", script="import math\nimport socket\nprint(1)")
        assert is_error and imported["status"] == "invalid_request" and imported["stdout"] == "", imported
        assert "`socket` (line 2)" in imported["error"]["message"]
        # The call gave no allowed_imports: the error names the profile's policy, and the fix.
        assert "the profile `basic`'s import policy does not allow" in imported["error"]["message"], imported
        assert "name a profile whose import policy allows them" in imported["error"]["hint"], imported
        assert imported["events"] == [{"kind": "import_blocked",
                                       "detail": "import of `socket` (line 2) is outside the import policy"}]

        package, _, is_error = await call(client, "execute_python", script="print(1)", dependencies=["requests>=2.31"])
        assert is_error and package["status"] == "invalid_request", package
        assert "does not allow installing `requests`" in package["error"]["message"]
        assert "it allows no packages" in package["error"]["hint"] and "check_environment" in package["error"]["hint"]
        assert [e["kind"] for e in package["events"]] == ["policy_refused"], package["events"]
        assert package["resolved_dependencies"] == [] and package["setup_ms"] == 0

        written, _, _ = await call(client, "execute_python", script=WRITE)
        assert written["stdout"] == "refused 30\n", written  # EROFS: /work is read-only
        written, _, _ = await call(client, "execute_python", script=WRITE, profile="filesystem")
        assert written["stdout"] == "written\n" and written["profile"] == "filesystem", written
        assert [a["name"] for a in written["artifacts"]] == ["out.txt"]

    lines = audit_lines(data)
    finished = {line["execution_id"]: line for line in lines if line["phase"] == "finished"}
    assert finished[denied["execution_id"]]["profile"] == "basic"
    assert [e["kind"] for e in finished[denied["execution_id"]]["events"]] == ["exec_blocked"]
    assert finished[package["execution_id"]]["events"][0]["kind"] == "policy_refused"
    assert finished[allowed["execution_id"]]["profile"] == "standard"
    started = {line["execution_id"]: line for line in lines if line["phase"] == "started"}
    assert started[denied["execution_id"]]["profile"] == "basic"  # asked for: the default
    assert started[written["execution_id"]]["profile"] == "filesystem"


async def test_a_call_narrows_limits_and_never_widens_them(snakebox_bin, tmp_path, mode):
    fill = "data = b'x' * (200 << 20)\nprint(len(data) >> 20)\n"
    async with connect(snakebox_bin, tmp_path / "data", mode, "--profile", "basic") as client:
        # The profile's own limit (256 MiB) holds 200 MiB; the call's narrower one does not.
        fits, _, _ = await call(client, "execute_python", script=fill)
        assert fits["status"] == "ok" and fits["stdout"] == "200\n", fits
        narrowed, _, _ = await call(client, "execute_python", script=fill, memory_limit="128m")
        assert narrowed["status"] == "memory_limit", narrowed
        assert [e["kind"] for e in narrowed["events"]] == ["memory_limit"], narrowed["events"]
        wider, _, is_error = await call(client, "execute_python", script="print(1)", memory_limit="1g")
        assert is_error and wider["status"] == "invalid_request" and wider["stdout"] == "", wider
        assert "above the profile `basic`'s limit of 256 MiB" in wider["error"]["message"]
        assert "at most 256 MiB" in wider["error"]["hint"]
        assert [e["kind"] for e in wider["events"]] == ["policy_refused"]
        imports, _, is_error = await call(client, "execute_python", script="print(1)", allowed_imports=["os"])
        assert is_error and "`os` which the profile `basic` does not allow" in imports["error"]["message"]
        narrowed_imports, _, _ = await call(client, "execute_python", script="import json\nprint(1)",
                                            allowed_imports=["math"])
        assert "`json` (line 1)" in narrowed_imports["error"]["message"], narrowed_imports
        bad, text, is_error = await call(client, "execute_python", script="print(1)", memory_limit="lots")
        assert is_error and bad["error"]["kind"] == "invalid" and "256m" in bad["error"]["hint"], text
        for tiny in ("0", "1m"):
            small, text, is_error = await call(client, "execute_python", script="print(1)", memory_limit=tiny)
            assert is_error and f"memory_limit: `{tiny}` is below 16MiB" in small["error"]["message"], text
            assert "16MiB or more" in small["error"]["hint"], text
        unknown, _, _ = await call(client, "execute_python", script="print(1)", profile="nope")
        assert unknown["status"] == "invalid_request" and "data_science" in unknown["error"]["hint"]
        # validate_script checks against the profile's import policy, as the run would.
        checked, _, _ = await call(client, "validate_script", script="import math\nimport socket\n")
        assert checked["valid"] is False, checked
        assert [(p["line"], p["kind"]) for p in checked["problems"]] == [(2, "import_not_allowed")], checked
        checked, _, _ = await call(client, "validate_script", script="import socket\n", profile="standard")
        assert checked["valid"] is True, checked


async def test_profiles_from_the_config_file_network_and_the_audit_of_other_tools(snakebox_bin, tmp_path, mode):
    data = tmp_path / "data"
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG)
    fetch = ("import urllib.request\ntry:\n    urllib.request.urlopen('http://blocked.test/', timeout=10)\n"
             "except Exception as err:\n    print('failed', type(err).__name__)\n")
    async with connect(snakebox_bin, data, mode, "--config", str(config), "--network", "allow:allowed.test") as client:
        report, _, _ = await call(client, "check_environment")
        by_name = {p["name"]: p for p in report["profiles"]}
        assert report["default_profile"] == "standard"
        assert set(by_name) == {"standard", "basic", "data_science", "network", "filesystem", "offline_tools", "web"}
        assert by_name["basic"]["subprocesses"] is False and by_name["basic"]["network"] == "off"
        assert any("seccomp" in line for line in by_name["basic"]["enforces"])
        assert any("guard rail" in line for line in by_name["basic"]["enforces"])
        assert by_name["web"]["network"] == "allow:allowed.test"
        assert by_name["offline_tools"]["allowed_imports"] is None

        spawned, _, _ = await call(client, "execute_python", script="import subprocess\n"
                                   "try:\n    subprocess.run(['/bin/true'])\nexcept OSError as err:\n    print('refused', err.errno)\n",
                                   profile="offline_tools")
        assert spawned["stdout"] == "refused 1\n" and spawned["profile"] == "offline_tools", spawned
        assert [e["kind"] for e in spawned["events"]] == ["exec_blocked"], spawned["events"]
        assert "`/bin/true`" in spawned["events"][0]["detail"]

        blocked, _, _ = await call(client, "execute_python", script=fetch, profile="web")
        assert blocked["status"] == "ok" and blocked["stdout"].startswith("failed"), blocked
        denied = [e for e in blocked["network_log"] if not e["allowed"]]
        assert denied and denied[0]["host"] == "blocked.test" and "allowlist" in denied[0]["reason"], blocked["network_log"]
        assert [e["kind"] for e in blocked["events"]] == ["network_denied"], blocked["events"]
        offline, _, is_error = await call(client, "execute_python", script="print(1)", profile="basic", network=True)
        assert is_error and "allows no network" in offline["error"]["message"], offline
        wider, _, is_error = await call(client, "execute_python", script="print(1)", profile="web",
                                        allowed_domains=["other.test"])
        assert is_error and "profile `web` does not allow" in wider["error"]["message"], wider

    lines = audit_lines(data)
    calls = [line for line in lines if line["phase"] == "call"]
    assert [(c["tool"], c["tenant"], c["status"]) for c in calls] == [("check_environment", "local", "ok")], calls
    finished = {line["execution_id"]: line for line in lines if line["phase"] == "finished"}
    assert finished[blocked["execution_id"]]["profile"] == "web"
    assert finished[blocked["execution_id"]]["events"][0]["kind"] == "network_denied"
    shown = subprocess.run([str(snakebox_bin), "audit", "--data-dir", str(data)], capture_output=True, text=True, timeout=60)
    assert "check_environment  ok" in shown.stdout and "profile web" in shown.stdout, shown.stdout


def test_a_bad_profile_setting_is_refused_with_a_hint(snakebox_bin, tmp_path):
    config = tmp_path / "bad.toml"
    for text, expected in [
        ('[profiles.x]\nnetwork = "sometimes"\n', "write \"off\", \"server\""),
        ("[profiles.x]\nmemory = \"1MiB\"\n", "is below 16MiB, too little for Python to start"),
        ("[profiles.x]\nsubprocess = false\n", "unknown field `subprocess`"),
        ('[server]\nprofile = "nope"\n', "name one of basic, data_science"),
    ]:
        config.write_text(text)
        done = subprocess.run([str(snakebox_bin), "check", "--config", str(config), "--data-dir", str(tmp_path / "d")],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode != 0 and expected in done.stderr, (text, done.stderr)


def test_over_http_a_tenant_names_only_the_profiles_the_operator_allowed_it(snakebox_bin, tmp_path):
    from http_support import http_server, make_key
    from test_ui import call_tool

    data = tmp_path / "data"
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG + '\n[server]\nprofile = "basic"\n')
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    with http_server(snakebox_bin, data, "--config", str(config), "--network", "allow:allowed.test") as (_proc, url):
        # The server's default profile is every tenant's.
        default = call_tool(url, key_b, "execute_python", {"script": "print(1)"})
        assert default["status"] == "ok" and default["profile"] == "basic", default
        # `web` is team-a's alone; nobody else may name it, nor a built-in left unlisted.
        mine = call_tool(url, key_a, "execute_python", {"script": "print(2)", "profile": "web"})
        assert mine["status"] == "ok" and mine["profile"] == "web", mine
        theirs = call_tool(url, key_b, "execute_python", {"script": "print(3)", "profile": "web"})
        assert theirs["status"] == "invalid_request" and theirs["stdout"] == "", theirs
        assert "not allowed for tenant `team-b`" in theirs["error"]["message"]
        assert "[profiles.web] tenants" in theirs["error"]["hint"]
        assert [e["kind"] for e in theirs["events"]] == ["policy_refused"]
        report = call_tool(url, key_b, "check_environment", {})
        available = {p["name"]: p["available"] for p in report["profiles"]}
        assert available["basic"] and not available["web"] and not available["standard"], available
    finished = {line["execution_id"]: line for line in audit_lines(data) if line["phase"] == "finished"}
    assert finished[theirs["execution_id"]]["tenant"] == "team-b"
    assert finished[theirs["execution_id"]]["events"][0]["kind"] == "policy_refused"
    calls = [line for line in audit_lines(data) if line["phase"] == "call"]
    assert [(c["tool"], c["tenant"]) for c in calls] == [("check_environment", "team-b")], calls


PTH_PACKAGE = "snakebox-probe-exec"
PTH_MODULE = "snakebox_probe_exec"
# Runs from the package's `.pth` line when an interpreter of its environment starts: tries to
# start a program and keeps what happened, for the script to print.
PTH_PROBE = r'''
import os
try:
    pid = os.posix_spawn("/bin/true", ["/bin/true"], {})
    FOUND = "spawned %d" % os.waitpid(pid, 0)[1]
except OSError as err:
    FOUND = "refused %d" % err.errno
'''


@pytest.fixture
def exec_probe_index(tmp_path_factory: pytest.TempPathFactory):
    from test_caller_code import SimpleIndex, pack_wheel

    wheel = pack_wheel(tmp_path_factory.mktemp("wheel"), PTH_PACKAGE, {
        f"{PTH_MODULE}/__init__.py": PTH_PROBE.encode(),
        f"{PTH_MODULE}.pth": f"import {PTH_MODULE}\n".encode(),
    })
    index = SimpleIndex(wheel, PTH_PACKAGE)
    try:
        yield {"UV_INDEX_URL": index.url}
    finally:
        index.close()


async def test_a_dependencys_start_up_code_runs_under_the_exec_deny_on_a_cold_start(snakebox_bin, tmp_path, exec_probe_index):
    """Cold runs start Python without `site` and run it after the exec-deny program is loaded:
    a `.pth` line of the environment that starts a program at interpreter start is refused too
    (and the same environment's `.pth` under `standard` starts it: the probe ran)."""
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG)
    script = f"import {PTH_MODULE}, sys\nprint({PTH_MODULE}.FOUND, sys.flags.no_site)\n"
    async with connect(snakebox_bin, tmp_path / "data", "legacy", "--config", str(config), "--fork-server", "off",
                       "--warm-pool", "0", env=exec_probe_index) as client:
        free, _, _ = await call(client, "execute_python", script=script, dependencies=[f"{PTH_PACKAGE}==1.0"],
                                timeout_seconds=120)
        assert free["status"] == "ok" and free["stdout"] == "spawned 0 0\n", free
        denied, _, _ = await call(client, "execute_python", script=script, dependencies=[f"{PTH_PACKAGE}==1.0"],
                                  profile="offline_tools")
        assert denied["status"] == "ok" and denied["stdout"] == "refused 1 1\n", denied
        assert [e["kind"] for e in denied["events"]] == ["exec_blocked"], denied["events"]


SESSION_CONFIG = """
[profiles.tools]
description = "sessions allowed: one package, no network"
network = "off"
packages = ["six"]
tenants = ["*"]
"""


async def test_a_session_is_held_to_its_profiles_network_and_packages(snakebox_bin, tmp_path, mode):
    config = tmp_path / "snakebox.toml"
    config.write_text(SESSION_CONFIG)
    async with connect(snakebox_bin, tmp_path / "data", mode, "--config", str(config), "--network", "on") as client:
        # Under `tools`: no network even on a server with network, and only its packages.
        offline, _, is_error = await call(client, "create_session", profile="tools", network=True)
        assert is_error and "allows no network" in offline["error"]["message"], offline
        package, _, is_error = await call(client, "create_session", profile="tools", dependencies=["requests>=2.31"])
        assert is_error and "does not allow installing `requests`" in package["error"]["message"], package
        created, _, is_error = await call(client, "create_session", profile="tools")
        assert not is_error and created["profile"] == "tools" and created["network"] is False, created
        session = created["session_id"]
        try:
            cell, _, _ = await call(client, "execute_python", session_id=session, script="import socket\n"
                                    "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=2)\n"
                                    "except OSError as err:\n    print('no network', type(err).__name__)\n")
            assert cell["status"] == "ok" and cell["stdout"].startswith("no network"), cell
            install, _, is_error = await call(client, "install_packages", session_id=session, packages=["requests"])
            assert is_error and "does not allow installing `requests`" in install["error"]["message"], install
            listed, _, _ = await call(client, "list_sessions")
            assert [s["profile"] for s in listed["sessions"] if s["session_id"] == session] == ["tools"], listed
        finally:
            await call(client, "delete_session", session_id=session)
        # The server's own settings (standard) still give a session with its network.
        plain, _, _ = await call(client, "create_session")
        assert plain["profile"] == "standard" and plain["network"] is True, plain
        await call(client, "delete_session", session_id=plain["session_id"])


# Starts a shell that leaves a marker in the session's workspace (a directory of the host's
# data directory), reaching `os` without importing it.
SESSION_SPAWN = """g = next(c for c in ().__class__.__base__.__subclasses__() if c.__name__ == "_wrap_close").__init__.__globals__
print("alive")
try:
    pid = g["posix_spawn"]("/bin/sh", ["/bin/sh", "-c", "echo started > /work/marker"], {})
    print("spawned", g["waitpid"](pid, 0)[1])
except OSError as err:
    print("refused", err.errno)
"""
FILL = "data = b'x' * (300 << 20)\nprint(len(data) >> 20)\n"


async def test_a_session_is_held_to_its_whole_profile(snakebox_bin, tmp_path, mode):
    data = tmp_path / "data"
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG)
    async with connect(snakebox_bin, data, mode, "--config", str(config)) as client:
        # The control: under `standard` the program starts and leaves its marker; 300 MiB fit.
        plain, _, _ = await call(client, "create_session")
        try:
            spawned, _, _ = await call(client, "execute_python", session_id=plain["session_id"], script=SESSION_SPAWN)
            assert spawned["status"] == "ok" and spawned["stdout"] == "alive\nspawned 0\n", spawned
            assert spawned["profile"] == "standard", spawned
            marker = session_dir(data, plain["session_id"]) / "work" / "marker"
            assert marker.read_text() == "started\n"
            fits, _, _ = await call(client, "execute_python", session_id=plain["session_id"], script=FILL)
            assert fits["status"] == "ok" and fits["stdout"] == "300\n", fits
        finally:
            await call(client, "delete_session", session_id=plain["session_id"])
        # Under a profile that only denies subprocesses (a writable workspace): no marker.
        tools, text, _ = await call(client, "create_session", profile="offline_tools")
        try:
            work = session_dir(data, tools["session_id"]) / "work"
            stopped, _, _ = await call(client, "execute_python", session_id=tools["session_id"], script=SESSION_SPAWN)
            assert stopped["status"] == "ok" and stopped["stdout"] == "alive\nrefused 1\n", stopped
            assert [e["kind"] for e in stopped["events"]] == ["exec_blocked"], stopped["events"]
            assert work.is_dir() and not (work / "marker").exists()
            touched, _, _ = await call(client, "execute_python", session_id=tools["session_id"],
                                       script="open('mine.txt', 'w').write('x')")
            assert touched["status"] == "ok" and (work / "mine.txt").read_text() == "x", touched
        finally:
            await call(client, "delete_session", session_id=tools["session_id"])

        created, text, is_error = await call(client, "create_session", profile="basic")
        assert not is_error and created["profile"] == "basic" and created["network"] is False, text
        session = created["session_id"]
        try:
            first, _, _ = await call(client, "execute_python", session_id=session, script="import math\nx = math.sqrt(16)\n")
            assert first["status"] == "ok" and first["profile"] == "basic", first
            denied, _, _ = await call(client, "execute_python", session_id=session, script=SESSION_SPAWN)
            assert denied["status"] == "ok" and denied["stdout"] == "alive\nrefused 1\n", denied
            assert [e["kind"] for e in denied["events"]] == ["exec_blocked"], denied["events"]

            imported, _, _ = await call(client, "execute_python", session_id=session, script="y = 1\nimport socket\n")
            assert imported["status"] == "error" and imported["exception"]["type_name"] == "ImportError", imported
            assert "outside the import policy" in imported["exception"]["message"], imported
            assert imported["events"] == [{"kind": "import_blocked",
                                           "detail": "import of `socket` (line 2) is outside the import policy"}], imported
            written, _, _ = await call(client, "execute_python", session_id=session, script=WRITE)
            assert written["stdout"] == "refused 30\n", written  # EROFS: the workspace is read-only
            assert not (session_dir(data, session) / "work" / "out.txt").exists()
            # The interpreter and its state live on across cells.
            kept, _, _ = await call(client, "execute_python", session_id=session, script="print(x, y)")
            assert kept["stdout"] == "4.0 1\n" and kept["fresh_interpreter"] is False, kept
            shell, _, is_error = await call(client, "run_command", session_id=session, command="true")
            assert is_error and "denies subprocesses" in shell["error"]["message"], shell
            assert [e["kind"] for e in shell["events"]] == ["policy_refused"] and shell["profile"] == "basic", shell
            listed, _, _ = await call(client, "list_sessions")
            assert [s["profile"] for s in listed["sessions"] if s["session_id"] == session] == ["basic"], listed
            # Last: the profile's 256 MiB, not the server's 1 GiB (the interpreter is stopped).
            filled, _, _ = await call(client, "execute_python", session_id=session, script=FILL)
            assert filled["status"] == "memory_limit", filled
            assert "256" in filled["error"]["message"], filled
        finally:
            await call(client, "delete_session", session_id=session)

    finished = {line["execution_id"]: line for line in audit_lines(data) if line["phase"] == "finished"}
    assert finished[denied["execution_id"]]["profile"] == "basic"
    assert [e["kind"] for e in finished[denied["execution_id"]]["events"]] == ["exec_blocked"]
    assert [e["kind"] for e in finished[imported["execution_id"]]["events"]] == ["import_blocked"]
    assert finished[spawned["execution_id"]]["profile"] == "standard"


async def test_a_dependencys_start_up_code_runs_under_the_exec_deny_in_a_session(snakebox_bin, tmp_path, exec_probe_index):
    """A session's interpreter starts without `site` under a profile that denies subprocesses
    and runs it after the exec-deny program: the environment's `.pth` is refused there too,
    while the same package in a session under `standard` starts its program."""
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG)
    script = f"import {PTH_MODULE}, sys\nprint({PTH_MODULE}.FOUND, sys.flags.no_site)\n"
    async with connect(snakebox_bin, tmp_path / "data", "legacy", "--config", str(config),
                       env=exec_probe_index) as client:
        for profile, expected in (("standard", "spawned 0 0\n"), ("offline_tools", "refused 1 1\n")):
            created, text, is_error = await call(client, "create_session", profile=profile,
                                                 dependencies=[f"{PTH_PACKAGE}==1.0"])
            assert not is_error, text
            try:
                cell, _, _ = await call(client, "execute_python", session_id=created["session_id"], script=script)
                assert cell["status"] == "ok" and cell["stdout"] == expected, cell
                assert cell["profile"] == profile, cell
            finally:
                await call(client, "delete_session", session_id=created["session_id"])
