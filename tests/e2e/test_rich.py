"""Rich results end to end (issue 6): the last expression's value, the names defined, the
script's own exception and traceback, matplotlib/PIL images, files in, files out as artifacts
readable through `resources/read`, progress notifications and cancellation, through the real
binary and the official MCP client in both protocol eras."""

from __future__ import annotations

import base64
import struct
import json
import os
import signal
import subprocess
import textwrap
import time
import uuid
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from backend_support import HOST_PROC_ORACLE
from conftest import backend_flags, call

pytestmark = pytest.mark.anyio

MATPLOTLIB = "matplotlib==3.10.3"


def images(result) -> list:
    return [block for block in result.content if getattr(block, "type", "") == "image"]


def links(result) -> dict[str, object]:
    return {block.name: block for block in result.content if getattr(block, "type", "") == "resource_link"}


async def read_text(client, uri: str) -> str:
    contents = (await client.read_resource(uri)).contents
    assert len(contents) == 1
    return contents[0].text


@pytest.mark.docker_ci
async def test_last_expression_comes_back_as_data_with_the_names_defined(client):
    data, text, is_error = await call(client, "execute_python", script="x = 1\ndef f():\n    pass\n{'a': x}\n")
    assert not is_error and data["status"] == "ok", data
    assert data["result"] == {"repr": "{'a': 1}", "json": {"a": 1}, "type_name": "dict"}
    assert data["names"] == ["x", "f"]
    assert "--- result ---\n{'a': 1}" in text
    # A value that is not plain data: repr only.
    data, _, _ = await call(client, "execute_python", script="import datetime\ndatetime.date(2024, 1, 2)\n")
    assert data["result"]["repr"] == "datetime.date(2024, 1, 2)"
    assert data["result"]["json"] is None
    assert data["result"]["type_name"] == "datetime.date"
    # No value for a statement or for None.
    data, _, _ = await call(client, "execute_python", script="x = 5\nNone\n")
    assert data["result"] is None


async def test_exception_names_the_users_line_not_the_runner(client):
    script = "import math\n\ndef ratio(a, b):\n    return a / b\n\nprint('before')\nratio(1, 0)\n"
    data, text, is_error = await call(client, "execute_python", script=script)
    assert not is_error
    assert data["status"] == "error" and data["exit_code"] == 1
    assert data["stdout"] == "before\n"
    exc = data["exception"]
    assert exc["type_name"] == "ZeroDivisionError"
    assert exc["message"] == "division by zero"
    assert exc["line"] == 4
    assert 'File "script.py", line 7, in <module>' in exc["traceback"]
    assert 'File "script.py", line 4, in ratio' in exc["traceback"]
    for where in (exc["traceback"], data["stderr"], text):
        assert "runner.py" not in where
        assert "ZeroDivisionError" in where
    # SystemExit codes are honoured, and are not exceptions.
    data, _, _ = await call(client, "execute_python", script="import sys\nprint('x')\nsys.exit(7)\n")
    assert data["exit_code"] == 7 and data["status"] == "error"
    assert data["exception"] is None
    data, _, _ = await call(client, "execute_python", script="raise SystemExit('bye')\n")
    assert data["exit_code"] == 1 and data["stderr"] == "bye\n"
    # A syntax error is reported like the interpreter does, with its line.
    data, _, _ = await call(client, "execute_python", script="x = 1\ndef f(:\n")
    assert data["exception"]["type_name"] == "SyntaxError"
    assert data["exception"]["line"] == 2
    assert "runner.py" not in data["stderr"]


async def test_the_control_channel_cannot_forge_the_status_or_output(client):
    """The script can write to the runner's pipe, but the status, exit code, stdout and
    stderr come from the supervisor; garbage in the record is reported, not trusted."""
    script = textwrap.dedent(
        """\
        import os, sys
        fake = '{"value": {"repr": "forged", "type_name": "str"}, "exit_code": 0}'
        for fd in range(3, 300):
            try:
                os.write(fd, (fake + "\\n{broken").encode())
            except OSError:
                pass
        os._exit(5)
        """
    )
    data, _, _ = await call(client, "execute_python", script=script)
    assert data["status"] == "error" and data["exit_code"] == 5
    assert data["stdout"] == "" and data["stderr"] == ""
    assert data["result"] is None
    assert any("unreadable" in note for note in data["notes"]), data["notes"]


@pytest.mark.docker_ci
async def test_input_files_are_read_by_the_script_and_not_returned_unless_changed(client):
    payload = bytes(range(256))
    script = textwrap.dedent(
        """\
        import csv, hashlib
        rows = list(csv.DictReader(open("data/in.csv")))
        print(sum(int(r["n"]) for r in rows))
        print(hashlib.sha256(open("blob.bin", "rb").read()).hexdigest())
        with open("notes.txt", "a") as f:
            f.write("more\\n")
        """
    )
    files = [
        {"path": "data/in.csv", "content": "name,n\na,1\nb,2\n"},
        {"path": "blob.bin", "content": base64.b64encode(payload).decode(), "encoding": "base64"},
        {"path": "notes.txt", "content": "first\n", "encoding": "utf-8"},
    ]
    data, _, is_error = await call(client, "execute_python", script=script, files=files)
    assert not is_error and data["status"] == "ok", data
    import hashlib

    assert data["stdout"] == f"3\n{hashlib.sha256(payload).hexdigest()}\n"
    # Unchanged inputs are not artifacts; the modified one is.
    assert [a["name"] for a in data["artifacts"]] == ["notes.txt"]
    assert await read_text(client, data["artifacts"][0]["uri"]) == "first\nmore\n"
    # stdio results carry no download link (those are the HTTP face's).
    assert data["artifacts"][0]["download_url"] is None, data["artifacts"]


async def test_hostile_input_paths_are_refused_with_hints(client):
    for path, words in [
        ("/etc/passwd", "absolute"),
        ("../x", ".."),
        ("a/../../x", ".."),
        ("a\\b", "backslash"),
        ("", "empty"),
    ]:
        data, text, is_error = await call(
            client, "execute_python", script="print(1)", files=[{"path": path, "content": "x"}]
        )
        assert is_error and data["status"] == "invalid_request", (path, data)
        assert words in data["error"]["message"], (path, data["error"])
        assert data["error"]["hint"], path
        assert "hint:" in text
    data, _, is_error = await call(
        client, "execute_python", script="print(1)", files=[{"path": "x", "content": "@@", "encoding": "base64"}]
    )
    assert is_error and "base64" in data["error"]["message"]
    many = [{"path": f"f{i}", "content": ""} for i in range(101)]
    data, _, is_error = await call(client, "execute_python", script="print(1)", files=many)
    assert is_error and "at most 100" in data["error"]["message"]
    # The server keeps serving.
    data, _, _ = await call(client, "execute_python", script="print('alive')")
    assert data["stdout"] == "alive\n"


@pytest.mark.docker_ci
async def test_a_csv_written_by_the_script_is_listed_and_readable(client):
    script = textwrap.dedent(
        """\
        import os
        os.makedirs("out", exist_ok=True)
        with open("out/table.csv", "w") as f:
            f.write("x,y\\n1,2\\n3,4\\n")
        with open("raw.bin", "wb") as f:
            f.write(bytes([0, 159, 146, 150]))
        print("written")
        """
    )
    result = await client.call_tool("execute_python", {"script": script})
    data = result.structured_content
    assert data["status"] == "ok", data
    by_name = {a["name"]: a for a in data["artifacts"]}
    assert set(by_name) == {"out/table.csv", "raw.bin"}
    table = by_name["out/table.csv"]
    assert table["size"] == 12 and table["mime_type"] == "text/csv" and table["origin"] == "file"
    assert table["uri"] == f"snakebox://artifacts/{data['execution_id']}/out/table.csv"
    # Returned as resource links too.
    linked = links(result)
    assert str(linked["out/table.csv"].uri) == table["uri"]
    assert linked["out/table.csv"].mime_type == "text/csv"
    # resources/read: text for text, base64 for binary.
    contents = (await client.read_resource(table["uri"])).contents
    assert contents[0].text == "x,y\n1,2\n3,4\n"
    assert contents[0].mime_type == "text/csv"
    blob = (await client.read_resource(by_name["raw.bin"]["uri"])).contents[0]
    assert base64.b64decode(blob.blob) == bytes([0, 159, 146, 150])
    # The URI scheme is advertised as a template, and recent artifacts are listed.
    templates = (await client.list_resource_templates()).resource_templates
    assert any(t.uri_template.startswith("snakebox://artifacts/{execution_id}/") for t in templates)
    listed = {str(r.uri) for r in (await client.list_resources()).resources}
    assert table["uri"] in listed
    # Paths are confined on read as well.
    execution_id = data["execution_id"]
    for bad in [
        f"snakebox://artifacts/{execution_id}/../../../etc/passwd",
        f"snakebox://artifacts/{execution_id}/%2E%2E/%2E%2E/etc/passwd",
        f"snakebox://artifacts/{execution_id}//etc/passwd",
        f"snakebox://artifacts/{execution_id}/manifest.json",
        "snakebox://artifacts/nope/out/table.csv",
        "file:///etc/passwd",
    ]:
        with pytest.raises(MCPError):
            await client.read_resource(bad)


async def test_hostile_files_in_the_working_directory_are_skipped_safely(client, data_dir):
    script = textwrap.dedent(
        """\
        import os
        os.symlink("/etc/passwd", "passwd-link")
        os.symlink("/", "root-link")
        os.mkfifo("a-fifo")
        with open("big.bin", "wb") as f:
            try:
                f.truncate(2 << 30)       # 2 GiB, sparse
                print("sparse 2GiB")
            except OSError as err:        # above the per-file size limit of the sandbox
                f.truncate(200 << 20)     # still above the artifact limit per file
                print("sparse 200MiB", err.errno)
        open("ok.txt", "w").write("fine")
        """
    )
    data, _, _ = await call(client, "execute_python", script=script)
    assert data["status"] == "ok", data
    assert "sparse" in data["stdout"]
    assert [a["name"] for a in data["artifacts"]] == ["ok.txt"]
    skipped = {s["name"]: s["reason"] for s in data["skipped_files"]}
    assert "symbolic link" in skipped["passwd-link"]
    assert "symbolic link" in skipped["root-link"]
    assert "FIFO" in skipped["a-fifo"]
    assert "limit" in skipped["big.bin"]
    with pytest.raises(MCPError):
        await client.read_resource(f"snakebox://artifacts/{data['execution_id']}/passwd-link")
    # Nothing of the host's passwd and no huge file reached the store.
    store = data_dir / "artifacts-v1" / data["execution_id"]
    stored = [p for p in store.rglob("*") if p.is_file()]
    assert sorted(p.name for p in stored) == ["manifest.json", "ok.txt"]
    assert not any(p.is_symlink() for p in store.rglob("*"))


async def test_a_matplotlib_plot_arrives_as_an_image(client):
    script = textwrap.dedent(
        """\
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3], [1, 4, 9])
        plt.title("squares")
        plt.show()
        fig, ax = plt.subplots()
        ax.bar(["a", "b"], [3, 5])
        # left open: collected at the end
        """
    )
    result = await client.call_tool(
        "execute_python", {"script": script, "dependencies": [MATPLOTLIB], "timeout_seconds": 300}
    )
    data = result.structured_content
    assert data["status"] == "ok", data
    assert "non-interactive" not in data["stderr"]  # show() was handled, not warned about
    # fontconfig finds its configuration (issue 16 (8): every run printed a Fontconfig error).
    assert "Fontconfig" not in data["stderr"], data["stderr"]
    figures = [a for a in data["artifacts"] if a["origin"] == "figure"]
    assert [f["name"] for f in figures] == ["figure-1.png", "figure-2.png"]
    assert all(f["inline"] and f["mime_type"] == "image/png" for f in figures)
    shown = images(result)
    assert len(shown) == 2
    for image in shown:
        raw = base64.b64decode(image.data)
        assert raw.startswith(b"\x89PNG\r\n\x1a\n")
        assert image.mime_type == "image/png"
        assert len(raw) <= 1 << 20
    # The figure is an artifact too, readable as a blob.
    blob = (await client.read_resource(figures[0]["uri"])).contents[0]
    assert base64.b64decode(blob.blob).startswith(b"\x89PNG")


async def test_pil_value_and_saved_image_files_arrive_as_images(client):
    script = textwrap.dedent(
        """\
        from PIL import Image
        Image.new("RGB", (40, 20), "blue").save("saved.jpg")
        open("drawing.svg", "w").write('<svg xmlns="http://www.w3.org/2000/svg" width="10" height="10"><rect width="10" height="10"/></svg>')
        Image.new("RGB", (30, 30), "red")
        """
    )
    result = await client.call_tool(
        "execute_python", {"script": script, "dependencies": [MATPLOTLIB], "timeout_seconds": 300}
    )
    data = result.structured_content
    assert data["status"] == "ok", data
    assert data["result"]["type_name"].startswith("PIL.")
    by_name = {a["name"]: a for a in data["artifacts"]}
    assert by_name["result.png"]["origin"] == "value"
    assert by_name["saved.jpg"]["mime_type"] == "image/jpeg"
    assert by_name["drawing.svg"]["mime_type"] == "image/svg+xml"
    assert all(a["inline"] for a in by_name.values())
    assert sorted(i.mime_type for i in images(result)) == ["image/jpeg", "image/png", "image/svg+xml"]


async def test_large_images_are_linked_not_inlined(client):
    script = textwrap.dedent(
        """\
        import os
        png = b"\\x89PNG\\r\\n\\x1a\\n" + os.urandom(2 << 20)
        open("huge.png", "wb").write(png)
        for i in range(6):
            open(f"small{i}.png", "wb").write(b"\\x89PNG\\r\\n\\x1a\\n" + bytes(100))
        """
    )
    result = await client.call_tool("execute_python", {"script": script})
    data = result.structured_content
    by_name = {a["name"]: a for a in data["artifacts"]}
    assert by_name["huge.png"]["inline"] is False
    assert len(images(result)) == 4  # at most four inline images per reply
    assert len(links(result)) == 7  # every artifact is linked


async def test_progress_messages_arrive_while_the_script_runs(client):
    script = "import time\nfor i in range(3):\n    print('tick', i)\n    time.sleep(1)\n"
    start = time.monotonic()
    seen: list[tuple[float, str]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((time.monotonic() - start, message or ""))

    result = await client.call_tool("execute_python", {"script": script}, progress_callback=on_progress)
    finished = time.monotonic() - start
    assert result.structured_content["status"] == "ok"
    text = "".join(message for _, message in seen)
    assert "tick 0" in text and "tick 2" in text, seen
    # Streamed, not sent at the end: the first tick came well before the run finished.
    assert seen[0][0] < finished - 1.5, (seen, finished)
    # Whole lines, never the pieces the pipe delivered ('tick', ' ', '0'): issue 16 (8).
    assert [message for _, message in seen] == ["tick 0\n", "tick 1\n", "tick 2\n"], seen


# See: issue 12 (9): progress notifications stopped once the output budget was spent while the
# script kept printing, without a word.
@pytest.mark.parametrize("in_session", [False, True])
async def test_progress_says_when_the_output_budget_is_spent(client, in_session):
    # 200 KiB of lines against the default budget of 100 KiB, then a last line.
    script = "for i in range(4000):\n    print('line', i, 'x' * 40)\nprint('the end')\n"
    seen: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(message or "")

    arguments = {"script": script}
    session = None
    if in_session:
        created = await client.call_tool("create_session", {})
        session = created.structured_content["session_id"]
        arguments["session_id"] = session
    result = await client.call_tool("execute_python", arguments, progress_callback=on_progress)
    if session:
        await client.call_tool("delete_session", {"session_id": session})
    data = result.structured_content
    assert data["status"] == "ok" and data["stdout_truncated"], data
    assert data["stdout"].rstrip().endswith("the end"), data["stdout"][-200:]
    text = "".join(seen)
    assert "line 0 " in text, seen[:3]  # proof of life: lines were streamed
    notes = [m for m in seen if "output limit is reached" in m]
    assert len(notes) == 1, seen[-3:]
    assert "the end" not in text  # nothing after the budget was streamed
    assert len(text.encode()) <= 102400 + 1024


def _marker_pids(marker: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                if marker.encode() in f.read():
                    found.append(int(entry))
        except OSError:
            pass
    return found


def _loop_script(marker: str) -> str:
    return textwrap.dedent(
        f"""\
        import subprocess, sys, time
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
        i = 0
        while True:
            print("tick", i, flush=True)
            i += 1
            time.sleep(0.2)
        """
    )


@pytest.mark.docker_ci
@pytest.mark.not_runsc(HOST_PROC_ORACLE)
async def test_cancelling_a_run_kills_it_within_a_second(client):
    marker = f"sbx-cancel-{uuid.uuid4().hex}"
    ticks: list[str] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        ticks.append(message or "")

    with anyio.CancelScope() as scope:

        async def run() -> None:
            await client.call_tool(
                "execute_python", {"script": _loop_script(marker), "timeout_seconds": 120}, progress_callback=on_progress
            )

        async with anyio.create_task_group() as group:
            group.start_soon(run)
            with anyio.fail_after(60):
                while not (ticks and _marker_pids(marker)):
                    await anyio.sleep(0.05)
            scope.cancel()
    cancelled_at = time.monotonic()
    assert scope.cancelled_caught
    while _marker_pids(marker) and time.monotonic() - cancelled_at < 5:
        await anyio.sleep(0.05)
    gone_after = time.monotonic() - cancelled_at
    assert not _marker_pids(marker), "the run's processes outlived the cancellation"
    assert gone_after < 1.0, gone_after
    # Proof of life: the server still runs scripts.
    data, _, _ = await call(client, "execute_python", script="print('after')")
    assert data["stdout"] == "after\n"


@pytest.mark.docker_ci
@pytest.mark.not_runsc(HOST_PROC_ORACLE)
def test_cancelled_run_keeps_its_output_and_says_cancelled(snakebox_bin, data_dir, tmp_path: Path):
    """The same cancellation through the CLI (SIGINT), where the record is visible: status
    `cancelled` and the output printed so far (an MCP client gets no reply to a request it
    cancelled)."""
    marker = f"sbx-cancel-{uuid.uuid4().hex}"
    script = tmp_path / "loop.py"
    script.write_text(_loop_script(marker))
    process = subprocess.Popen(
        [str(snakebox_bin), "run", str(script), "--json", "--data-dir", str(data_dir), "--no-warm-cache", *backend_flags()],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + 60
    while not _marker_pids(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _marker_pids(marker), "the run never started"
    time.sleep(0.5)
    process.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = process.communicate(timeout=30)
    assert time.monotonic() - sent < 1.0
    assert process.returncode == 130, err
    record = json.loads(out)
    assert record["status"] == "cancelled"
    assert "tick 0" in record["stdout"]
    assert not _marker_pids(marker)


async def test_tool_description_explains_files_values_and_images(client):
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    description = tools["execute_python"].description
    for words in ("files", "last expression", "image", "artifact", "resources/read"):
        assert words in description, words
    props = tools["execute_python"].input_schema["properties"]
    assert "files" in props
    schema = tools["execute_python"].output_schema["properties"]
    for field in ("result", "names", "exception", "artifacts", "skipped_files"):
        assert field in schema, field


async def test_images_are_never_inlined_larger_than_providers_take(client):
    """issue 16 (8): a 9000 px image was inlined as is, and providers refuse over 8000 px. A
    figure is rendered to fit; an image file that does not fit is kept as an artifact, not
    inlined, and a note says why."""
    script = textwrap.dedent(
        """\
        import struct, zlib
        import matplotlib.pyplot as plt
        fig = plt.figure(figsize=(90, 10), dpi=100)  # 9000 x 1000 px as asked
        plt.plot([1, 2, 3])

        def png(width, height):
            raw = b"".join(b"\\0" + bytes(width) for _ in range(height))
            chunk = lambda kind, body: struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
            header = struct.pack(">IIBBBBB", width, height, 8, 0, 0, 0, 0)
            return b"\\x89PNG\\r\\n\\x1a\\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b"")

        open("huge.png", "wb").write(png(9000, 9000))
        open("small.png", "wb").write(png(10, 10))
        """
    )
    result = await client.call_tool(
        "execute_python", {"script": script, "dependencies": [MATPLOTLIB], "timeout_seconds": 300}
    )
    data = result.structured_content
    assert data["status"] == "ok", data
    inline = {a["name"]: a["inline"] for a in data["artifacts"]}
    assert inline == {"figure-1.png": True, "huge.png": False, "small.png": True}, inline
    for image in images(result):
        raw = base64.b64decode(image.data)
        width, height = struct.unpack(">II", raw[16:24])
        assert max(width, height) <= 8000, (width, height)
    assert any("huge.png (9000x9000 px) is not shown inline" in note for note in data["notes"]), data["notes"]
