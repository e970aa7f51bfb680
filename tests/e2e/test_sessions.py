"""Persistent sessions end to end (issue 4): variables, packages and files that last across
calls, isolation between sessions, a timeout that restarts the interpreter, and sessions
that survive a SIGKILL of the server. Real binary, official MCP client, both protocol eras."""

from __future__ import annotations

import base64
import os
import signal
import time
from pathlib import Path

import pytest

from conftest import call, connect, server_pid, session_dir

pytestmark = pytest.mark.anyio

MATPLOTLIB = "matplotlib==3.10.3"


async def create(client, **arguments) -> str:
    data, text, is_error = await call(client, "create_session", **arguments)
    assert not is_error, text
    assert data["session_id"].startswith("s-")
    return data["session_id"]


async def run(client, session_id: str, script: str, **arguments):
    data, text, is_error = await call(client, "execute_python", script=script, session_id=session_id, **arguments)
    assert data["session_id"] == session_id, text
    return data, text, is_error


async def test_session_tools_are_listed(client):
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    expected = {
        "create_session", "list_sessions", "delete_session", "reset_session", "install_packages",
        "list_packages", "run_command", "write_file", "read_file", "list_files",
    }
    assert expected <= set(tools)
    assert "session_id" in tools["execute_python"].input_schema["properties"]
    for name in expected:
        assert tools[name].output_schema.get("type") == "object", name


@pytest.mark.docker_ci
async def test_variables_persist_between_calls(client):
    session = await create(client, name="notebook")
    data, text, is_error = await run(client, session, "x = 41\nprint('set')")
    assert not is_error and data["status"] == "ok", text
    assert data["stdout"] == "set\n"
    assert data["fresh_interpreter"] is True
    data, text, _ = await run(client, session, "x + 1")
    assert data["status"] == "ok", text
    assert data["fresh_interpreter"] is False
    assert data["result"]["json"] == 42
    assert data["result"]["repr"] == "42"
    # Functions and imports persist too; the working directory is the workspace.
    await run(client, session, "import os\ndef double(v):\n    return 2 * v")
    data, _, _ = await run(client, session, "print(double(x), os.getcwd())")
    assert data["stdout"].split()[0] == "82"
    # An exception is a normal result and the interpreter carries on.
    data, _, is_error = await run(client, session, "1 / 0")
    assert not is_error and data["status"] == "error"
    assert data["exception"]["type_name"] == "ZeroDivisionError"
    assert "ZeroDivisionError" in data["stderr"]
    data, _, _ = await run(client, session, "x")
    assert data["result"]["json"] == 41 and data["fresh_interpreter"] is False
    await call(client, "delete_session", session_id=session)


async def test_installed_package_is_importable_in_the_next_call(client):
    session = await create(client)
    data, text, is_error = await call(client, "install_packages", session_id=session, packages=["six==1.16.0"], wait_seconds=240)
    assert not is_error, text
    assert data["state"] == "succeeded", text
    assert {"name": "six", "version": "1.16.0"} in data["packages"]
    data, text, _ = await run(client, session, "import six\nsix.__version__")
    assert data["status"] == "ok", text
    assert data["result"]["json"] == "1.16.0"
    listing, _, _ = await call(client, "list_packages", session_id=session)
    assert any(p["name"] == "six" for p in listing["packages"])
    assert listing["install"]["state"] == "succeeded"
    # The environment is read-only to the session's code: it cannot change what uv installed.
    data, _, _ = await run(client, session, "import six, pathlib\ntry:\n    pathlib.Path(six.__file__).write_text('x')\n    print('WROTE')\nexcept OSError as e:\n    print('denied', type(e).__name__)")
    assert data["stdout"].startswith("denied"), data
    await call(client, "delete_session", session_id=session)


@pytest.mark.docker_ci
async def test_files_written_by_code_are_read_and_listed(client):
    session = await create(client)
    data, text, _ = await run(client, session, "import pathlib\npathlib.Path('results').mkdir()\npathlib.Path('results/out.txt').write_text('hello from code\\n')")
    assert data["status"] == "ok", text
    data, text, is_error = await call(client, "read_file", session_id=session, path="results/out.txt")
    assert not is_error, text
    assert data["content"] == "hello from code\n" and data["encoding"] == "utf-8"
    data, _, _ = await call(client, "list_files", session_id=session)
    paths = {entry["path"]: entry for entry in data["entries"]}
    assert paths["results"]["kind"] == "directory"
    assert paths["results/out.txt"]["size"] == len("hello from code\n")
    # The other way round: a file written by the tool is read by code.
    data, text, is_error = await call(client, "write_file", session_id=session, path="data/in.csv", content="a,b\n1,2\n")
    assert not is_error, text
    data, _, _ = await run(client, session, "open('data/in.csv').read().splitlines()")
    assert data["result"]["json"] == ["a,b", "1,2"]
    # A shell command sees the same workspace.
    data, text, _ = await call(client, "run_command", session_id=session, command="cat data/in.csv | wc -l && python -c 'import sys; print(sys.prefix)'")
    assert data["status"] == "ok", text
    assert data["stdout"].split()[0] == "2"
    # Paths outside the workspace are refused, with a hint.
    for bad in ["../secret", "/etc/passwd", "a/../../b"]:
        data, text, is_error = await call(client, "read_file", session_id=session, path=bad)
        assert is_error, bad
        assert data["error"]["hint"]
    # A symlink planted by code to a host file is not followed by the file tools.
    await run(client, session, "import os\nos.symlink('/etc/hostname', 'link')")
    data, _, is_error = await call(client, "read_file", session_id=session, path="link")
    assert is_error and "symbolic link" in data["error"]["message"]
    await call(client, "delete_session", session_id=session)


async def test_input_files_of_a_session_call_are_in_the_workspace(client):
    session = await create(client)
    files = [
        {"path": "data/in.csv", "content": "a,b\n1,2\n"},
        {"path": "blob.bin", "content": base64.b64encode(bytes([0, 255, 1])).decode(), "encoding": "base64"},
    ]
    data, text, _ = await run(client, session, "open('data/in.csv').read().splitlines(), list(open('blob.bin', 'rb').read())", files=files)
    assert data["status"] == "ok", text
    assert data["result"]["json"] == [["a,b", "1,2"], [0, 255, 1]]
    # Inputs are not artifacts (they were there before the code ran), and they stay.
    assert data["artifacts"] == []
    listing, _, _ = await call(client, "list_files", session_id=session)
    assert "data/in.csv" in {entry["path"] for entry in listing["entries"]}
    # Owned by the sandbox user: the session's code can change them.
    data, text, _ = await run(client, session, "open('data/in.csv', 'a').write('3,4\\n')")
    assert data["status"] == "ok", text
    # Paths are confined, and a symlink planted by code is not followed.
    await run(client, session, "import os\nos.symlink('/tmp', 'escape')")
    for bad in ["../x", "/etc/x", "escape/x"]:
        data, text, is_error = await run(client, session, "1", files=[{"path": bad, "content": "x"}])
        assert is_error and data["status"] == "invalid_request", (bad, text)
        assert data["error"]["hint"], bad
    await call(client, "delete_session", session_id=session)


async def test_files_a_session_call_writes_come_back_as_artifacts(client):
    session = await create(client)
    script = "import os\nos.makedirs('out', exist_ok=True)\nopen('out/table.csv', 'w').write('x,y\\n1,2\\n')\nprint('written')"
    result = await client.call_tool("execute_python", {"script": script, "session_id": session})
    data = result.structured_content
    assert data["status"] == "ok", data
    by_name = {a["name"]: a for a in data["artifacts"]}
    assert set(by_name) == {"out/table.csv"}, data["artifacts"]
    table = by_name["out/table.csv"]
    assert table["mime_type"] == "text/csv" and table["origin"] == "file"
    assert table["uri"] == f"snakebox://artifacts/{data['execution_id']}/out/table.csv"
    assert any(getattr(b, "type", "") == "resource_link" and str(b.uri) == table["uri"] for b in result.content)
    contents = (await client.read_resource(table["uri"])).contents
    assert contents[0].text == "x,y\n1,2\n"
    # A call that does not touch the file returns no artifact; one that changes it does.
    data, _, _ = await run(client, session, "1 + 1")
    assert data["artifacts"] == []
    data, _, _ = await run(client, session, "open('out/table.csv', 'a').write('3,4\\n')")
    assert [a["name"] for a in data["artifacts"]] == ["out/table.csv"]
    await call(client, "delete_session", session_id=session)


async def test_a_cell_reports_what_it_changed_and_nothing_written_between_cells(client):
    """A cell starts from what the previous cell's collection saw of the workspace instead of
    walking it again (issue 19). That view must stay exact: a file rewritten in place with the
    same size, in a subdirectory, is the cell's artifact; files that the file tools, a command
    or the call's own input files put there are not the next cell's."""
    session = await create(client)
    data, _, _ = await run(
        client,
        session,
        "import os\nos.makedirs('deep/er', exist_ok=True)\nopen('deep/er/same.bin', 'wb').write(b'a' * 64)",
    )
    assert [a["name"] for a in data["artifacts"]] == ["deep/er/same.bin"], data
    # Nothing written: nothing reported. The sleep lets a coarse file clock tick, so that the
    # rewrite below has a new modification time even on kernels that stamp by the tick.
    data, _, _ = await run(client, session, "import time\ntime.sleep(0.05)")
    assert data["status"] == "ok" and data["artifacts"] == [], data
    # Same name, same size, new bytes.
    data, _, _ = await run(client, session, "with open('deep/er/same.bin', 'r+b') as f:\n    f.write(b'b' * 64)")
    assert [a["name"] for a in data["artifacts"]] == ["deep/er/same.bin"], data
    contents = (await client.read_resource(data["artifacts"][0]["uri"])).contents
    assert base64.b64decode(contents[0].blob) == b"b" * 64
    # A file written through the file tools between two cells is not the next cell's...
    _, text, is_error = await call(client, "write_file", session_id=session, path="up/loaded.txt", content="given")
    assert not is_error, text
    data, _, _ = await run(client, session, "y = open('up/loaded.txt').read()")
    assert data["status"] == "ok" and data["artifacts"] == [], data
    # ...nor one a command writes...
    _, text, is_error = await call(client, "run_command", session_id=session, command="mkdir -p cmd && echo hi > cmd/made.txt")
    assert not is_error, text
    data, _, _ = await run(client, session, "z = open('cmd/made.txt').read()")
    assert data["status"] == "ok" and data["artifacts"] == [], data
    # ...nor the call's own input file; what the cell itself writes still is.
    data, _, _ = await run(
        client,
        session,
        "open('up/loaded.txt', 'a').write(' and more')",
        files=[{"path": "in/given.txt", "content": "input"}],
    )
    assert [a["name"] for a in data["artifacts"]] == ["up/loaded.txt"], data
    data, _, _ = await run(client, session, "1 + 1")
    assert data["artifacts"] == [], data
    await call(client, "delete_session", session_id=session)


async def test_a_matplotlib_plot_in_a_session_arrives_as_an_image(client):
    session = await create(client)
    data, text, is_error = await call(client, "install_packages", session_id=session, packages=[MATPLOTLIB], wait_seconds=280)
    assert not is_error and data["state"] == "succeeded", text
    data, text, _ = await run(client, session, "import matplotlib.pyplot as plt\nxs = [1, 2, 3]")
    assert data["status"] == "ok", text
    result = await client.call_tool(
        "execute_python",
        {"session_id": session, "script": "plt.plot(xs, [v * v for v in xs])\nplt.show()\nfig, ax = plt.subplots()\nax.bar(['a'], [1])\n"},
    )
    data = result.structured_content
    assert data["status"] == "ok", data
    assert "non-interactive" not in data["stderr"]
    figures = [a for a in data["artifacts"] if a["origin"] == "figure"]
    assert [f["name"] for f in figures] == ["figure-1.png", "figure-2.png"], data
    shown = [block for block in result.content if getattr(block, "type", "") == "image"]
    assert len(shown) == 2 and all(base64.b64decode(i.data).startswith(b"\x89PNG") for i in shown)
    # Figures are closed after the cell, as in a notebook: the next cell shows none.
    data, text, _ = await run(client, session, "len(plt.get_fignums())")
    assert data["result"]["json"] == 0 and data["artifacts"] == [], text
    await call(client, "delete_session", session_id=session)


async def test_check_environment_lists_sessions(client):
    session = await create(client, name="reported")
    await run(client, session, "x = 1")
    data, text, is_error = await call(client, "check_environment")
    assert not is_error, text
    sessions = data["sessions"]
    assert sessions["available"] is True
    listed = {s["session_id"]: s for s in sessions["sessions"]}
    assert listed[session]["name"] == "reported"
    assert listed[session]["interpreter_running"] is True
    assert sessions["count"] >= 1 and sessions["running_interpreters"] >= 1
    assert sessions["max_sessions"] > 0 and sessions["max_disk_bytes"] > 0
    assert sessions["idle_stop_seconds"] > 0 and sessions["idle_delete_seconds"] > sessions["idle_stop_seconds"]
    await call(client, "delete_session", session_id=session)
    data, _, _ = await call(client, "check_environment")
    assert session not in {s["session_id"] for s in data["sessions"]["sessions"]}


async def test_least_recently_used_interpreter_is_stopped_at_the_cap(snakebox_bin: Path, tmp_path: Path, mode: str):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    async with connect(snakebox_bin, data_dir, mode, "--session-max-interpreters", "1") as client:
        a = await create(client)
        b = await create(client)
        await run(client, a, "x = 'a'\nopen('kept.txt', 'w').write('a')")
        await run(client, b, "y = 'b'")
        data, _, _ = await call(client, "check_environment")
        assert data["sessions"]["max_running_interpreters"] == 1
        assert data["sessions"]["running_interpreters"] == 1
        # A's interpreter was stopped to start B's: variables gone (and said so), files kept.
        data, text, _ = await run(client, a, "open('kept.txt').read(), 'x' in globals()")
        assert data["fresh_interpreter"] is True, text
        assert data["result"]["json"] == ["a", False]
        assert any("make room" in note for note in data["notes"]), data["notes"]


async def test_session_a_cannot_see_session_b(client, data_dir: Path):
    a = await create(client, name="a")
    b = await create(client, name="b")
    data, _, _ = await run(client, a, "open('secret.txt', 'w').write('canary-of-a')\nsecret_var = 'a-only'")
    assert data["status"] == "ok"
    host_file = session_dir(data_dir, a) / "work" / "secret.txt"
    assert host_file.read_text() == "canary-of-a", "proof that A wrote the file"
    probe = (
        "import os, glob\n"
        f"paths = ['/work/secret.txt', {str(host_file)!r}] + glob.glob('/*/secret.txt') + glob.glob('/*/*/secret.txt') + glob.glob('/tmp/**/secret.txt', recursive=True)\n"
        "found = []\n"
        "for p in paths:\n"
        "    try:\n"
        "        found.append(open(p).read())\n"
        "    except OSError:\n"
        "        pass\n"
        "print('found', found, 'var' , 'secret_var' in globals(), 'files', sorted(os.listdir('.')))"
    )
    data, text, _ = await run(client, b, probe, timeout_seconds=60)
    assert data["status"] == "ok", text
    assert data["stdout"].strip() == "found [] var False files []", text
    data, _, is_error = await call(client, "read_file", session_id=b, path="secret.txt")
    assert is_error
    for session in (a, b):
        await call(client, "delete_session", session_id=session)
    assert not host_file.exists()


@pytest.mark.docker_ci
async def test_timeout_restarts_the_interpreter_and_keeps_files(client):
    session = await create(client)
    await run(client, session, "kept = 1\nopen('kept.txt', 'w').write('still here')")
    started = time.monotonic()
    data, text, _ = await run(client, session, "while True:\n    pass", timeout_seconds=2)
    assert data["status"] == "timeout", text
    assert data["timed_out"] is True
    assert "variables are lost" in data["error"]["message"]
    assert time.monotonic() - started < 30
    data, text, _ = await run(client, session, "print('kept' in globals(), open('kept.txt').read())")
    assert data["status"] == "ok", text
    assert data["stdout"] == "False still here\n"
    assert data["fresh_interpreter"] is True
    assert any("timed out" in note for note in data["notes"]), data["notes"]
    await call(client, "delete_session", session_id=session)


async def test_concurrent_calls_to_one_session_queue_in_order(client):
    import anyio

    session = await create(client)
    await run(client, session, "order = []")
    results = {}

    async def step(i: int):
        results[i] = await run(client, session, f"import time\ntime.sleep(0.2)\norder.append({i})\nlen(order)")

    async with anyio.create_task_group() as group:
        for i in range(3):
            group.start_soon(step, i)
            await anyio.sleep(0.05)
    data, _, _ = await run(client, session, "order")
    assert data["result"]["json"] == [0, 1, 2]
    assert sorted(r[0]["result"]["json"] for r in results.values()) == [1, 2, 3]
    await call(client, "delete_session", session_id=session)


async def test_unknown_session_is_a_clear_error(client):
    data, text, is_error = await call(client, "execute_python", script="print(1)", session_id="s-doesnotexist00")
    assert is_error
    assert "No session" in data["error"]["message"]
    assert "create_session" in data["error"]["hint"]
    # Typed (issue 11): the kind says what an HTTP face or a client can act on.
    assert data["error"]["kind"] == "not_found" and data["status"] == "invalid_request", data
    # The session tools answer the same kind, in their own failure shape.
    for tool in ("delete_session", "reset_session", "list_packages"):
        data, text, is_error = await call(client, tool, session_id="s-doesnotexist00")
        assert is_error and data["error"]["kind"] == "not_found", (tool, data)
        assert text.startswith("error (not_found): No session"), (tool, text)


async def test_sessions_survive_kill_9_of_the_server(snakebox_bin: Path, tmp_path: Path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        session = await create(client, name="survivor")
        data, _, _ = await run(client, session, "state = 'in memory'\nopen('notes.txt', 'w').write('on disk')")
        assert data["status"] == "ok"
        pid = server_pid(data_dir)
        os.kill(pid, signal.SIGKILL)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists():
                break
            time.sleep(0.05)
    async with connect(snakebox_bin, data_dir, "legacy") as client:
        data, text, is_error = await call(client, "list_sessions")
        assert not is_error, text
        assert [s["session_id"] for s in data["sessions"]] == [session]
        assert data["sessions"][0]["name"] == "survivor"
        data, _, is_error = await call(client, "read_file", session_id=session, path="notes.txt")
        assert not is_error and data["content"] == "on disk"
        data, text, _ = await run(client, session, "print('state' in globals(), open('notes.txt').read())")
        assert data["status"] == "ok", text
        assert data["stdout"] == "False on disk\n"
        assert data["fresh_interpreter"] is True
        assert any("restarted" in note for note in data["notes"]), data["notes"]


async def test_a_cell_or_command_killed_by_a_signal_reports_it(client):
    session = await create(client)
    cell, _, _ = await run(client, session, "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)")
    assert cell["status"] == "error" and cell["signal"] == 9, cell
    command, _, _ = await call(client, "run_command", session_id=session, command="kill -TERM $$")
    assert command["status"] == "error" and command["signal"] == 15, command
    # The session goes on, with a fresh interpreter.
    after, _, _ = await run(client, session, "print('alive')")
    assert after["stdout"] == "alive\n" and after["fresh_interpreter"] is True, after
