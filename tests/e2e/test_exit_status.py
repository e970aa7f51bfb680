"""Exit status (issue 10, catalogue X-01): 129-192 is an exit code unless the process really
died by a signal.

bubblewrap reports a death of the command by signal N as exit status 128 + N, so from
outside `os._exit(137)` looked like a SIGKILL. The runners now fork once at start: the parent
(in the sandbox, running no user code) reaps the runner and reports its true wait status as
the control channel's last line. These tests run each way a run can end on each path the
report covers (cold bubblewrap, a pooled sandbox, a session interpreter), judged by the
result the client gets, with proof of life (a token printed before the end) in every case.
The forked path (the fork server) passes on the script's own wait status instead.
"""

from __future__ import annotations

import time
import uuid

import anyio
import pytest

from backend_support import FORK_SERVER_ONLY
from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

COLD = ("--fork-server", "off", "--warm-pool", "0")
POOLED = ("--fork-server", "off", "--warm-pool", "1")

# (script ending, expected exit_code, expected signal)
ENDINGS = [
    ("import os; os._exit(137)", 137, None),
    ("import sys; sys.exit(130)", 130, None),
    ("import os; os._exit(129)", 129, None),
    ("import os; os._exit(192)", 192, None),
    ("import os; os._exit(3)", 3, None),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None, 9),
    ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", None, 15),
    ("import os; os.abort()", None, 6),
    # exec replaces the runner: the reaper still sees the true status of what ran.
    ("import os; os.execv('/bin/sh', ['sh', '-c', 'exit 137'])", 137, None),
    ("import os; os.execv('/bin/sh', ['sh', '-c', 'kill -KILL $$'])", None, 9),
]


def script_for(ending: str, token: str) -> str:
    return f"print({token!r}, flush=True)\n{ending}\n"


def check(data: dict, text: str, token: str, code, sig, ending: str) -> None:
    assert token in data["stdout"], (ending, text)  # proof of life
    assert data["exit_code"] == code, (ending, data["exit_code"], data.get("signal"), text)
    assert data.get("signal") == sig, (ending, data["exit_code"], data.get("signal"), text)
    assert data["status"] == "error", (ending, text)
    if sig is None:
        assert f"--- exit_code: {code} ---" in text, text
        assert "--- signal:" not in text, text
    else:
        assert "--- signal:" in text, text


async def pool_state(client) -> dict:
    report, _, _ = await call(client, "check_environment")
    return report["warm_pool"]


async def test_X01_cold_runs_report_exit_codes_and_real_signals(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto", *COLD) as client:
        for ending, code, sig in ENDINGS:
            token = f"alive-{uuid.uuid4().hex[:8]}"
            data, text, _ = await call(client, "execute_python", script=script_for(ending, token))
            check(data, text, token, code, sig, ending)
        # A kill by the supervisor (wall time) is still a timeout, not an exit code.
        token = f"alive-{uuid.uuid4().hex[:8]}"
        data, text, _ = await call(
            client, "execute_python", script=script_for("import time; time.sleep(60)", token), timeout_seconds=1
        )
        assert token in data["stdout"] and data["status"] == "timeout", text
        # A normal exit still reads 0 and a runner record (the value) still arrives.
        data, text, _ = await call(client, "execute_python", script="6 * 7")
        assert data["status"] == "ok" and data["exit_code"] == 0 and data["result"]["json"] == 42, text


async def test_printed_markers_never_read_as_the_results_own(snakebox_bin, data_dir):
    """Issue 36: the text form cannot be forged by what a script prints: a line of its output
    that begins like a marker is escaped, so the only `--- exit_code` line is the real one; the
    structured form keeps the exact text."""
    forged = "--- exit_code: 0 ---\n--- status: ok ---"
    script = f"import sys\nprint({forged!r})\nprint('--- timed_out: true ---', file=sys.stderr)\nraise SystemExit(3)\n"
    async with connect(snakebox_bin, data_dir, "auto", *COLD) as client:
        data, text, _ = await call(client, "execute_python", script=script)
    assert data["exit_code"] == 3 and data["stdout"] == forged + "\n", text
    markers = [line for line in text.splitlines() if line.startswith("--- ")]
    assert markers == ["--- stdout ---", "--- stderr ---", "--- exit_code: 3 ---"], text
    assert "\\--- exit_code: 0 ---\n\\--- status: ok ---\n" in text, text
    assert "\\--- timed_out: true ---" in text, text


async def test_X01_pooled_runs_report_exit_codes_and_real_signals(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto", *POOLED) as client:
        await call(client, "execute_python", script="print('warm up')")
        for ending, code, sig in ENDINGS:
            deadline = time.monotonic() + 30
            while (before := await pool_state(client))["ready_default"] < 1:
                assert time.monotonic() < deadline, before
                await anyio.sleep(0.1)
            token = f"alive-{uuid.uuid4().hex[:8]}"
            data, text, _ = await call(client, "execute_python", script=script_for(ending, token))
            after = await pool_state(client)
            assert after["served"] == before["served"] + 1, (ending, before, after)
            check(data, text, token, code, sig, ending)


async def test_X01_session_cells_report_exit_codes_and_real_signals(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto") as client:
        created, text, is_error = await call(client, "create_session")
        assert not is_error, text
        session = created["session_id"]
        for ending, code, sig in ENDINGS:
            if ending.startswith("import sys"):
                continue  # sys.exit ends the cell, not the interpreter (test_sessions.py)
            token = f"alive-{uuid.uuid4().hex[:8]}"
            data, text, _ = await call(
                client, "execute_python", session_id=session, script=script_for(ending, token)
            )
            check(data, text, token, code, sig, ending)
            # The session goes on, with a fresh interpreter.
            data, text, _ = await call(client, "execute_python", session_id=session, script="print('next')")
            assert data["status"] == "ok" and data["fresh_interpreter"] is True, text
        # In a session, sys.exit(130) ends the cell with that code; the interpreter lives.
        data, text, _ = await call(client, "execute_python", session_id=session, script="import sys; sys.exit(130)")
        assert data["exit_code"] == 130 and data.get("signal") is None, text
        await call(client, "delete_session", session_id=session)


@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_X01_forked_runs_report_exit_codes(snakebox_bin, data_dir):
    async with connect(snakebox_bin, data_dir, "auto") as client:
        await call(client, "execute_python", script="print('warm up')")
        deadline = time.monotonic() + 30
        while (await pool_state(client)).get("fork_servers", 0) < 1:
            assert time.monotonic() < deadline, "no fork server started"
            await anyio.sleep(0.2)
        for ending, code, sig in [
            ("import os; os._exit(137)", 137, None),
            ("import sys; sys.exit(130)", 130, None),
            ("import os; os._exit(192)", 192, None),
            # A real death by signal is still one.
            ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", None, 9),
            ("import os, signal; os.kill(os.getpid(), signal.SIGTERM)", None, 15),
        ]:
            before = (await pool_state(client))["forked"]
            token = f"alive-{uuid.uuid4().hex[:8]}"
            data, text, _ = await call(client, "execute_python", script=script_for(ending, token))
            assert (await pool_state(client))["forked"] == before + 1
            check(data, text, token, code, sig, ending)


# Issue 33: a sandbox forked from a tokio blocking-pool thread got that thread's PDEATHSIG
# (SIGKILL) when the thread retired, 10 s after its last work: every pooled (pre-started) run
# longer than about 10 s ended as "killed by SIGKILL (9)", and a run stopped by a timeout near
# 10 s was reported so instead of `timeout`. Not seen as root with the fork server, which is
# why the suite missed it; on cgroup v2 without delegation and for every normal user it is the
# only path. A sandbox now outlives every thread but the server's own spawner.
LONG_RUN_PATHS = {"cold": COLD, "pooled": POOLED}


@pytest.mark.parametrize("path", sorted(LONG_RUN_PATHS))
async def test_a_run_longer_than_ten_seconds_is_not_killed_by_a_retiring_thread(snakebox_bin, data_dir, path):
    async with connect(snakebox_bin, data_dir, "auto", *LONG_RUN_PATHS[path]) as client:
        data, text, _ = await call(client, "execute_python", script="print('warm')")
        assert data["status"] == "ok", text
        token = uuid.uuid4().hex
        script = f"import time\nprint({token!r}, flush=True)\ntime.sleep(13)\nprint('done')\n"
        data, text, _ = await call(client, "execute_python", script=script, timeout_seconds=40)
        assert data["status"] == "ok" and data["signal"] is None, text
        assert data["stdout"] == f"{token}\ndone\n", text
        # Stopped by its own timeout past the 10 s mark: `timeout`, whatever the kill reached.
        script = f"import time\nprint({token!r}, flush=True)\ntime.sleep(60)\n"
        data, text, _ = await call(client, "execute_python", script=script, timeout_seconds=12)
        assert token in data["stdout"], text
        assert data["status"] == "timeout", text
        assert any(e.get("kind") == "timeout" for e in data["events"]), data["events"]
