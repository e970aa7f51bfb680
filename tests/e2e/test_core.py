"""The one-shot path end to end: `execute_python`, `validate_script`, `check_environment`
through the real binary and the official MCP client, in both protocol eras."""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from mcp import MCPError

from conftest import call, connect, process_rss_kib, reported_backend, server_pid

pytestmark = pytest.mark.anyio

PEP723_SIX = textwrap.dedent(
    """\
    # /// script
    # requires-python = ">=3.8"
    # dependencies = ["six==1.16.0"]
    # ///
    import six
    print("six", six.__version__)
    """
)


async def test_tools_are_listed_with_object_output_schemas(client):
    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    assert {"execute_python", "validate_script", "check_environment"} <= set(tools)
    for tool in tools.values():
        assert tool.output_schema is not None, tool.name
        assert tool.output_schema.get("type") == "object", tool.name
        assert tool.description and len(tool.description) > 80
    props = tools["execute_python"].input_schema["properties"]
    assert {"script", "dependencies", "timeout_seconds", "python_version"} <= set(props)


@pytest.mark.docker_ci
async def test_hello_world_returns_structured_and_text_forms(client):
    data, text, is_error = await call(client, "execute_python", script="print('hi')")
    assert not is_error
    assert data["status"] == "ok"
    assert data["exit_code"] == 0
    assert data["stdout"] == "hi\n"
    assert data["timed_out"] is False
    assert data["python_version"].startswith("3.")
    assert data["execution_id"]
    assert "--- stdout ---\nhi\n" in text
    assert "--- exit_code: 0 ---" in text


@pytest.mark.docker_ci
async def test_exit_code_and_stderr_are_passed_through(client):
    script = "import sys\nprint('out')\nprint('oops', file=sys.stderr)\nsys.exit(3)\n"
    data, text, is_error = await call(client, "execute_python", script=script)
    assert not is_error  # the tool worked; the script failed
    assert data["status"] == "error"
    assert data["exit_code"] == 3
    assert data["stderr"] == "oops\n"
    assert "--- stderr ---\noops" in text
    assert "--- exit_code: 3 ---" in text


async def test_exception_traceback_names_the_users_line(client):
    data, _, _ = await call(client, "execute_python", script="x = 1\ny = 0\nprint(x / y)\n")
    assert data["status"] == "error"
    assert "ZeroDivisionError" in data["stderr"]
    assert "line 3" in data["stderr"]


@pytest.mark.docker_ci
async def test_pep723_script_with_a_real_dependency(client):
    data, _, _ = await call(client, "execute_python", script=PEP723_SIX, timeout_seconds=120)
    assert data["status"] == "ok", data
    assert data["stdout"] == "six 1.16.0\n"
    assert "six==1.16.0" in data["requested_dependencies"]
    assert {"name": "six", "version": "1.16.0"} in data["resolved_dependencies"]
    # The same requirement set again: the cached environment is reused.
    again, _, _ = await call(client, "execute_python", script=PEP723_SIX)
    assert again["status"] == "ok"
    assert again["environment_reused"] is True


async def test_dependencies_argument_wins_on_a_name_clash(client):
    script = textwrap.dedent(
        """\
        # /// script
        # dependencies = ["six==1.15.0"]
        # ///
        import six
        print(six.__version__)
        """
    )
    data, _, _ = await call(client, "execute_python", script=script, dependencies=["Six==1.16.0"], timeout_seconds=120)
    assert data["status"] == "ok", data
    assert data["stdout"].strip() == "1.16.0"
    assert not any(dep.startswith("six==1.15") for dep in data["requested_dependencies"])


async def test_crlf_script_with_metadata_runs(client):
    script = "# /// script\r\n# dependencies = []\r\n# ///\r\nprint('crlf ok')\r\n"
    data, _, _ = await call(client, "execute_python", script=script)
    assert data["status"] == "ok", data
    assert data["stdout"].strip() == "crlf ok"


async def test_block_inside_string_literal_is_left_untouched(client):
    # The peer deleted such text from the user's code. We never edit the script: the string
    # keeps every line (PEP 723's line-based regex does read it as metadata, and it is valid).
    script = 'text = """\n# /// script\n# dependencies = []\n# ///\n"""\nprint(len(text.splitlines()))\n'
    data, _, _ = await call(client, "execute_python", script=script)
    assert data["status"] == "ok", data
    assert data["stdout"].strip() == "4"


@pytest.mark.docker_ci
async def test_timeout_kills_the_run_and_keeps_partial_output(client):
    script = "import time\nprint('before', flush=True)\ntime.sleep(60)\nprint('after')\n"
    data, text, is_error = await call(client, "execute_python", script=script, timeout_seconds=2)
    assert not is_error
    assert data["status"] == "timeout"
    assert data["timed_out"] is True
    assert data["stdout"] == "before\n"
    assert "--- timed_out: true ---" in text
    # Killed near the limit, not after the 60 s sleep (a generous bound: machines are noisy).
    assert data["duration_ms"] < 15_000


async def test_stdin_is_empty_not_the_mcp_stream(client):
    data, _, _ = await call(client, "execute_python", script="import sys\nprint(repr(sys.stdin.read()))\n")
    assert data["status"] == "ok"
    assert data["stdout"].strip() == "''"


async def test_bad_arguments_get_clear_errors_and_the_server_keeps_serving(client):
    data, text, is_error = await call(client, "execute_python", script="print(1)", timeout_seconds=-5)
    assert is_error and data["status"] == "invalid_request"
    assert "timeout_seconds" in data["error"]["message"] and data["error"]["hint"]
    assert data["error"]["kind"] == "invalid"
    assert "hint:" in text

    # Over the script limit (1 MiB): the tool says so.
    huge = "x = 1\n" * (4 * 1024 * 1024 // 6)
    data, _, is_error = await call(client, "execute_python", script=huge)
    assert is_error and data["status"] == "invalid_request"
    assert "bytes" in data["error"]["message"]

    # Over the message limit (16 MiB): the stdio framing answers with an error naming it.
    with pytest.raises(MCPError) as raised:
        await call(client, "execute_python", script="x = 1\n" * (50 * 1024 * 1024 // 6))
    assert raised.value.error.code == -32600 and "16777216" in raised.value.error.message

    data, _, is_error = await call(client, "execute_python", script="print(1)", python_version="2.5")
    assert is_error and data["status"] == "setup_failed"
    assert data["error"]["kind"] == "unavailable"
    assert "3.11" in data["error"]["message"] or "3.11" in (data["error"]["hint"] or "")

    data, _, is_error = await call(client, "execute_python", script="print(1)", dependencies=["numpy>="])
    assert is_error and data["status"] == "invalid_request"
    assert "numpy>=" in data["error"]["message"]

    data, _, is_error = await call(client, "execute_python", script="print(1)", dependencies=["surely-not-a-real-package-snakebox-4242==1.0"], timeout_seconds=120)
    assert is_error and data["status"] == "setup_failed"
    assert data["error"]["kind"] == "failed" and data["error"]["hint"]

    # Proof of life after all of that.
    data, _, is_error = await call(client, "execute_python", script="print('still here')")
    assert not is_error and data["stdout"] == "still here\n"


async def test_large_timeout_is_clamped_with_a_note(client):
    data, text, _ = await call(client, "execute_python", script="print(1)", timeout_seconds=100000)
    assert data["status"] == "ok"
    assert data["timeout_seconds"] == 300
    assert any("300" in note for note in data["notes"])


async def test_a_fractional_timeout_is_rounded_up_with_a_note(client):
    data, text, _ = await call(client, "execute_python", script="print(1)", timeout_seconds=1.5)
    assert data["status"] == "ok" and data["timeout_seconds"] == 2, data
    assert "timeout_seconds 1.5 was rounded up to 2 (limits are whole seconds)" in data["notes"], data
    assert "note: timeout_seconds 1.5 was rounded up to 2" in text


@pytest.mark.docker_ci
async def test_output_is_capped_head_and_tail_with_bounded_server_memory(snakebox_bin, data_dir):
    script = "import sys\nsys.stdout.write('HEAD\\n')\nchunk = 'x' * 1048575 + '\\n'\nfor _ in range(200):\n    sys.stdout.write(chunk)\nsys.stdout.write('TAIL\\n')\nsys.stderr.write('E' * 500000)\n"
    async with connect(snakebox_bin, data_dir, "auto") as client:
        await call(client, "execute_python", script="print('warm')")
        pid = server_pid(data_dir)
        before = process_rss_kib(pid)
        data, _, _ = await call(client, "execute_python", script=script, timeout_seconds=120)
        after = process_rss_kib(pid)
    assert data["status"] == "ok", data["error"]
    assert data["stdout_truncated"] is True
    assert data["stdout"].startswith("HEAD\n")
    assert data["stdout"].endswith("TAIL\n")
    assert "truncated" in data["stdout"]
    # One budget for both streams: the peer let each stream reach the limit.
    kept = len(data["stdout"].encode()) + len(data["stderr"].encode())
    assert kept <= 102_400 + 1024
    # 200 MiB went through; the server's memory grew by a few MiB at most.
    assert after - before < 16 * 1024, f"RSS grew by {after - before} KiB"


async def test_validate_reports_every_problem(client):
    script = textwrap.dedent(
        """\
        # /// script
        # dependencies = "requests"
        # requires-python = ">=3.99"
        # ///
        print('unclosed'
        """
    )
    data, text, is_error = await call(client, "validate_script", script=script, dependencies=["numpy>=", "requests[", "pandas>=2.2"])
    assert not is_error
    assert data["valid"] is False
    kinds = [p["kind"] for p in data["problems"]]
    assert "wrong_type" in kinds, kinds
    assert kinds.count("invalid_requirement") >= 2, kinds
    assert any(k in kinds for k in ("no_matching_python", "python_unavailable")), kinds
    assert "invalid:" in text


async def test_validate_finds_syntax_errors_with_line_and_column(client):
    data, _, _ = await call(client, "validate_script", script="x = 1\ndef f(:\n    pass\n")
    assert data["valid"] is False
    syntax = [p for p in data["problems"] if p["kind"] == "syntax_error"]
    assert syntax and syntax[0]["line"] == 2 and syntax[0]["column"]


async def test_validate_rejects_two_blocks_and_malformed_toml(client):
    two = "# /// script\n# dependencies = []\n# ///\nimport os\n# /// script\n# dependencies = []\n# ///\nprint(1)\n"
    data, _, _ = await call(client, "validate_script", script=two)
    assert [p["kind"] for p in data["problems"]] == ["multiple_blocks"]
    bad = "# /// script\n# dependencies = [\n# ///\nprint(1)\n"
    data, _, _ = await call(client, "validate_script", script=bad)
    assert "malformed_toml" in [p["kind"] for p in data["problems"]]


async def test_validate_accepts_a_good_script_without_running_it(client, tmp_path: Path):
    marker = tmp_path / "ran"
    script = f"open({str(marker)!r}, 'w').write('x')\n"
    data, text, _ = await call(client, "validate_script", script=script)
    assert data["valid"] is True, data
    assert text.startswith("valid")
    assert not marker.exists()


@pytest.mark.docker_ci
async def test_check_environment_reports_backend_limits_and_pythons(client):
    data, _, is_error = await call(client, "check_environment")
    assert not is_error
    assert data["snakebox_version"]
    assert data["sandbox_backend"] == reported_backend()
    assert data["isolation_active"] is True
    assert data["network"] is False
    assert any(p["version"].startswith("3.11") for p in data["pythons"])
    names = {limit["name"] for limit in data["limits"]}
    assert {"wall_time", "memory", "max_processes", "max_output_bytes", "network"} <= names
    assert all(limit["enforced"] for limit in data["limits"] if limit["name"] in {"wall_time", "memory", "max_processes", "network"})
    assert "uv" in data and data["uv"]
    assert data["ready"] is True
    assert data["cache"]["retention"]


async def test_arguments_a_client_adds_are_ignored_and_typos_refused(client):
    """Gemini CLI adds `wait_for_previous` to every call: the call runs, and the result says
    the argument was ignored. A misspelled argument of ours is refused with the one meant,
    never silently dropped (the code would run outside the session the caller named)."""
    result, text, is_error = await call(client, "execute_python", script="print('ran')", wait_for_previous=True)
    assert not is_error and result["stdout"] == "ran\n", text
    assert any("wait_for_previous" in note for note in result["notes"]), result["notes"]
    assert "ignored argument `wait_for_previous`" in text
    listed, text, is_error = await call(client, "list_sessions", wait_for_previous=True)
    assert not is_error and "sessions" in listed and "wait_for_previous" in text

    with pytest.raises(MCPError) as refused:
        await client.call_tool("execute_python", {"script": "print(1)", "sesion_id": "s-0123"})
    assert "did you mean `session_id`" in str(refused.value)


async def test_the_seeds_names_code_and_timeout_are_read_as_script_and_timeout_seconds(client):
    """Prompts written for IBM's sandbox and the python code executor send `code` and
    `timeout` (issue 36): execute_python reads them as `script` and `timeout_seconds`, and
    says so; neither name is in its schema; both names at once are refused, not guessed."""
    result, text, is_error = await call(client, "execute_python", code="import time\nprint('ran')", timeout=3)
    assert not is_error and result["stdout"] == "ran\n", text
    assert result["timeout_seconds"] == 3, text
    assert "read `code` as `script` (this tool's name for it)" in result["notes"], result["notes"]
    assert "read `timeout` as `timeout_seconds` (this tool's name for it)" in result["notes"]
    slow, text, _ = await call(client, "execute_python", code="import time\ntime.sleep(30)", timeout=1)
    assert slow["status"] == "timeout", text

    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    properties = tools["execute_python"].input_schema["properties"]
    assert "code" not in properties and "timeout" not in properties

    with pytest.raises(MCPError) as refused:
        await client.call_tool("execute_python", {"script": "print(1)", "code": "print(2)"})
    assert "give `script` only" in str(refused.value)


async def test_cache_warm_builds_each_listed_requirement_at_start(snakebox_bin, data_dir, tmp_path):
    """`[cache] warm` (issue 36, as mcp-python-exec-sandbox's warm-up packages): each listed
    requirement's environment is built at start-up, after the default one, so the first run
    declaring it reuses it."""
    import anyio
    from mcp import Client
    from mcp.client.stdio import StdioServerParameters

    from conftest import backend_flags

    config = tmp_path / "config.toml"
    config.write_text('[cache]\nwarm = ["six==1.16.0"]\n')
    params = StdioServerParameters(
        command=str(snakebox_bin),
        args=["serve", "--data-dir", str(data_dir), "--config", str(config), *backend_flags(())],
        env={"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    async with Client(params, mode="auto", read_timeout_seconds=300) as client:
        with anyio.fail_after(240):
            while True:
                report, _, _ = await call(client, "check_environment")
                warm = report["cache"]["warm"]
                if warm["state"] in ("ready", "failed"):
                    break
                await anyio.sleep(0.5)
        assert warm["state"] == "ready", warm
        assert report["cache"]["environments"] >= 2, report["cache"]
        data, text, _ = await call(client, "execute_python", script="import six; print(six.__version__)", dependencies=["six==1.16.0"])
    assert data["status"] == "ok" and data["stdout"] == "1.16.0\n", text
    assert data["environment_reused"] is True, text
