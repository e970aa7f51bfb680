"""The ways code runs agree on a call's policy (issue 34, item 1: "one function decides a call's
policy"). Read side by side, one-shot runs, session cells, session commands and the
compatibility tools used to disagree where a caller could see it; each divergence is pinned
here through the real binary:

- a `memory_limit` result names the run's own limit (a 128m call, a profile's 256 MiB), not
  the server's 1 GiB;
- a session command asking for more time than its session's profile allows is refused, as a
  cell is (it was silently cut to the profile's limit and reported the time it asked for);
- a fractional `timeout_seconds` is rounded up with a note on every path (the MCP face added
  the note for `execute_python` only; each face converted the number itself);
- a cell's `memory_limit` or `profile` is refused by the engine (the MCP face refused it while
  the engine accepted and ignored it: a face decided);
- the compatibility `validate_code` holds `allowed_imports` to the profile as `execute_code`
  does (a call could widen the list, so it said "valid" for code `execute_code` refuses).
"""

from __future__ import annotations

import pytest

from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

FILL = "data = b'x' * (300 << 20)\nprint(len(data) >> 20)\n"

CONFIG = """
[profiles.quick]
description = "calls of at most 5 seconds"
timeout = 5
"""


async def test_a_memory_limit_result_names_the_runs_own_limit(snakebox_bin, tmp_path, mode):
    async with connect(snakebox_bin, tmp_path / "data", mode) as client:
        narrowed, text, _ = await call(client, "execute_python", script=FILL, memory_limit="128m")
        assert narrowed["status"] == "memory_limit", text
        assert "memory limit of 128 MiB" in narrowed["error"]["message"], narrowed["error"]
        held, text, _ = await call(client, "execute_python", script=FILL, profile="basic")
        assert held["status"] == "memory_limit", text
        assert "memory limit of 256 MiB" in held["error"]["message"], held["error"]
        # A session under `basic`: its cell and its command name the profile's limit too.
        session, text, _ = await call(client, "create_session", profile="basic")
        cell, text, _ = await call(client, "execute_python", session_id=session["session_id"], script=FILL)
        assert cell["status"] == "memory_limit", text
        assert "memory limit of 256 MiB" in cell["error"]["message"], cell["error"]
        # A cell cannot change the limits its session's interpreter lives under: refused by the
        # engine (not ignored), whatever face the call came through.
        for narrowing in ({"memory_limit": "128m"}, {"profile": "standard"}):
            refused, text, is_error = await call(client, "execute_python", session_id=session["session_id"],
                                                 script="print(1)", **narrowing)
            assert is_error and refused["status"] == "invalid_request", text
            assert "apply to one-shot runs, not to a session's cells" in refused["error"]["message"], text


async def test_a_session_command_is_held_to_its_profiles_time_as_a_cell_is(snakebox_bin, tmp_path, mode):
    config = tmp_path / "snakebox.toml"
    config.write_text(CONFIG)
    async with connect(snakebox_bin, tmp_path / "data", mode, "--config", str(config)) as client:
        session, text, _ = await call(client, "create_session", profile="quick")
        session_id = session["session_id"]
        cell, text, is_error = await call(client, "execute_python", session_id=session_id, script="print(1)",
                                          timeout_seconds=30)
        assert is_error and cell["status"] == "invalid_request", text
        assert "above the profile `quick`'s limit of 5 s" in cell["error"]["message"], cell["error"]
        command, text, is_error = await call(client, "run_command", session_id=session_id, command="echo hi",
                                             timeout_seconds=30)
        assert is_error and command["status"] == "invalid_request", text
        assert "above the profile `quick`'s limit of 5 s" in command["error"]["message"], command["error"]
        assert [e["kind"] for e in command["events"]] == ["policy_refused"], command["events"]
        within, text, _ = await call(client, "run_command", session_id=session_id, command="echo hi",
                                     timeout_seconds=4)
        assert within["status"] == "ok" and within["stdout"] == "hi\n" and within["timeout_seconds"] == 4, text
        # A fraction is rounded up and said so, by a command and a cell alike (only
        # execute_python's one-shot runs said so: the face did it).
        for tool, arguments in (("run_command", {"command": "echo hi"}), ("execute_python", {"script": "print('hi')"})):
            rounded, text, _ = await call(client, tool, session_id=session_id, timeout_seconds=2.5, **arguments)
            assert rounded["status"] == "ok" and rounded["timeout_seconds"] == 3, text
            assert "timeout_seconds 2.5 was rounded up to 3 (limits are whole seconds)" in rounded["notes"], (tool, text)
        # Left out, the call gets the profile's limit (the server's default is longer).
        default, text, _ = await call(client, "run_command", session_id=session_id, command="sleep 8")
        assert default["status"] == "timeout" and default["timeout_seconds"] == 5, text


async def test_validate_code_holds_allowed_imports_to_the_profile_as_execute_code_does(snakebox_bin, tmp_path, mode):
    async with connect(snakebox_bin, tmp_path / "data", mode, "--compat-tools", "--profile", "basic") as client:
        code = "import socket\nprint(socket.gethostname())"
        ran, text, is_error = await call(client, "execute_code", code=code, allowed_imports=["socket"])
        assert is_error and ran["success"] is False, text
        checked, text, _ = await call(client, "validate_code", code=code, allowed_imports=["socket"])
        assert checked["validation"]["valid"] is False, text
        assert any("socket" in error for error in checked["validation"]["errors"]), checked
        # Narrowing stays the caller's: math alone, so json is refused.
        narrowed, text, _ = await call(client, "validate_code", code="import json", allowed_imports=["math"])
        assert narrowed["validation"]["errors"] == ["Line 1: Import 'json' is not allowed"], narrowed


async def test_validate_script_refuses_a_malformed_module_name_as_execute_python_does(snakebox_bin, tmp_path, mode):
    # validate_script reported every import "not allowed" by a list holding a name that is no
    # module, where execute_python refused the list itself.
    async with connect(snakebox_bin, tmp_path / "data", mode) as client:
        ran, text, is_error = await call(client, "execute_python", script="import json", allowed_imports=["os-path"])
        assert is_error and ran["status"] == "invalid_request", text
        assert "`os-path` in allowed_imports is not a module name" in ran["error"]["message"], text
        checked, text, is_error = await call(client, "validate_script", script="import json",
                                             allowed_imports=["os-path"])
        assert is_error, text
        assert "`os-path` in allowed_imports is not a module name" in checked["error"]["message"], text


async def test_a_cells_refused_dependencies_are_its_profiles_refusal_as_a_one_shot_runs_are(snakebox_bin, tmp_path, mode):
    # A cell's dependencies outside its profile's allowlist were refused by the install, with
    # no `policy_refused` event; a one-shot run's refusal has one.
    async with connect(snakebox_bin, tmp_path / "data", mode) as client:
        ran, text, is_error = await call(client, "execute_python", script="print(1)", dependencies=["numpy"],
                                         profile="basic")
        assert is_error and ran["status"] == "invalid_request", text
        assert "The profile `basic` does not allow installing `numpy`" in ran["error"]["message"], text
        assert [e["kind"] for e in ran["events"]] == ["policy_refused"], ran["events"]
        session, text, _ = await call(client, "create_session", profile="basic")
        cell, text, is_error = await call(client, "execute_python", session_id=session["session_id"],
                                          script="print(1)", dependencies=["numpy"])
        assert is_error and cell["status"] == "invalid_request", text
        assert "The profile `basic` does not allow installing `numpy`" in cell["error"]["message"], text
        assert [e["kind"] for e in cell["events"]] == ["policy_refused"], cell["events"]
