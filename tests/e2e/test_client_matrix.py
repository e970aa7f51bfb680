"""One scenario list through three real clients (issue 16, "Proof"): tests/clients/scenarios.json
run by the official Python SDK (here, in pytest), the official TypeScript SDK
(tests/clients/matrix_flow.mjs, one process for the whole list) and the Inspector CLI (one
process per step: that is how it is used), each against its own `snakebox serve --http
--max-sessions 1` with an API key.

Every driver only reports what its client handed back, in one shape (an outcome per step);
`judge` holds every client to the same expectations: results, images, artifact reads,
progress, and on each tool's error path the kind, the message and the exact hint a model is
shown. A scenario a client cannot express is skipped for that client with the reason (see
`CANNOT`), never silently; `test_the_judge_notices_a_lost_hint` proves the judge fails when
a hint or message is lost on the way.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any, Callable

import anyio
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

from conftest import REPO, error_from_text, have_bwrap
from http_support import http_server, make_key
from test_clients import CLIENTS, client_env, run_client

pytestmark = pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed")

SCENARIOS_PATH = REPO / "tests" / "clients" / "scenarios.json"
SCENARIOS = {s["name"]: s for s in json.loads(SCENARIOS_PATH.read_text())["scenarios"]}
DRIVERS = ["python_sdk", "typescript_sdk", "inspector_cli"]

# What a client cannot do, and why: a scenario that `needs` it is skipped for that client.
CANNOT = {
    "inspector_cli": {
        "progress": "the Inspector CLI prints only the final result; progress notifications never reach its output",
        "string_for_a_number": "the Inspector CLI converts an argument to the number the input schema asks for "
                               "(`\"two\"` becomes NaN, sent as null), so this wrong type never reaches the server",
    },
}


def fill(value: Any, saved: dict[str, Any]) -> Any:
    """`{name}` in every string of `value` replaced by what an earlier step saved."""
    if isinstance(value, str):
        return re.sub(r"\{(\w+)\}", lambda m: str(saved.get(m.group(1), m.group(0))), value)
    if isinstance(value, list):
        return [fill(item, saved) for item in value]
    if isinstance(value, dict):
        return {k: fill(v, saved) for k, v in value.items()}
    return value


def dig(value: Any, path: str) -> Any:
    for part in path.split("."):
        if isinstance(value, list):
            value = value[int(part)] if part.isdigit() and int(part) < len(value) else None
        elif isinstance(value, dict):
            value = value.get(part)
        else:
            return None
    return value


def json_objects(text: str) -> list[dict[str, Any]]:
    """The JSON objects printed one after another in `text`."""
    decoder, found, at = json.JSONDecoder(), [], 0
    while True:
        start = text.find("{", at)
        if start < 0:
            return found
        try:
            value, at = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            at = text.find("\n", start) + 1 or len(text)
            continue
        if isinstance(value, dict):
            found.append(value)


def outcome() -> dict[str, Any]:
    return {"isError": None, "structured": None, "text": "", "images": [], "links": [], "progress": [],
            "protocolError": None, "contents": None}


def run_scenarios(step_runner: Callable[[dict[str, Any], dict[str, Any]], dict[str, Any]],
                  scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    """Every scenario's steps in order, saving what `save` names for later steps."""
    report = {}
    for scenario in scenarios:
        saved: dict[str, Any] = {}
        steps = []
        for step in scenario["steps"]:
            got = step_runner(step, saved)
            for name, path in step.get("save", {}).items():
                saved[name] = dig(got, path)
            steps.append(got)
        report[scenario["name"]] = {"saved": saved, "steps": steps}
    return report


# --- the drivers -------------------------------------------------------------------------


def python_sdk_report(url: str, key: str, scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    async def main() -> dict[str, Any]:
        http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
        async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), read_timeout_seconds=300) as client:
            report: dict[str, Any] = {"__tools__": [tool.name for tool in (await client.list_tools()).tools]}
            for scenario in scenarios:
                saved: dict[str, Any] = {}
                steps = []
                for step in scenario["steps"]:
                    got = await python_step(client, step, saved)
                    for name, path in step.get("save", {}).items():
                        saved[name] = dig(got, path)
                    steps.append(got)
                report[scenario["name"]] = {"saved": saved, "steps": steps}
            return report

    return anyio.run(main)


async def python_step(client: Client, step: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
    got = outcome()
    try:
        if "read" in step:
            read = await client.read_resource(fill(step["read"], saved))
            got["contents"] = [{"uri": str(c.uri), "mimeType": c.mime_type, "text": getattr(c, "text", None)}
                               for c in read.contents]
            return got

        async def on_progress(_progress: float, _total: float | None, message: str | None) -> None:
            got["progress"].append(message or "")

        result = await client.call_tool(step["tool"], fill(step["args"], saved), progress_callback=on_progress)
    except MCPError as error:
        got["protocolError"] = {"code": error.error.code, "message": error.error.message}
        return got
    got["isError"] = bool(result.is_error)
    got["structured"] = result.structured_content
    got["text"] = "".join(b.text for b in result.content if b.type == "text")
    got["images"] = [b.mime_type for b in result.content if b.type == "image"]
    got["links"] = [str(b.uri) for b in result.content if b.type == "resource_link"]
    return got


def typescript_sdk_report(url: str, key: str, home: Path) -> dict[str, Any]:
    # The script imports the SDK from target/clients: run it from there.
    script = CLIENTS.parent.parent / f"matrix-{home.name}.mjs"
    script.write_text((REPO / "tests" / "clients" / "matrix_flow.mjs").read_text())
    try:
        done = run_client(["node", str(script), str(SCENARIOS_PATH), url, key], client_env(home), CLIENTS.parent.parent, timeout=900)
    finally:
        script.unlink()
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def inspector_report(url: str, key: str, home: Path, scenarios: list[dict[str, Any]]) -> dict[str, Any]:
    env = client_env(home)
    base = ["mcp-inspector", "--cli", f"{url}/mcp", "--transport", "http", "--header", f"Authorization: Bearer {key}",
            "--format", "json"]

    def step_runner(step: dict[str, Any], saved: dict[str, Any]) -> dict[str, Any]:
        got = outcome()
        got["progress"] = None  # not observable through this client
        if "read" in step:
            args = [*base, "--method", "resources/read", "--uri", fill(step["read"], saved)]
        else:
            # The arguments as one JSON object (`--tool-arg k=v` would read each v as JSON
            # when it can: `script=1` sends the number 1). tests/e2e/test_clients.py calls
            # with --tool-arg.
            args = [*base, "--method", "tools/call", "--tool-name", step["tool"],
                    "--tool-args-json", json.dumps(fill(step["args"], saved))]
        done = run_client(args, env, home)
        # `--format json` prints `{"result": ...}` on stdout (and after an `isError` result,
        # `{"error": {"code": "tool_is_error", ...}}` on stderr), or only `{"error": {...}}` on
        # stderr when the server answered with a protocol error: its message, not its code.
        result = next((p["result"] for p in json_objects(done.stdout) if "result" in p), None)
        if result is None:
            error = next((p["error"] for p in json_objects(done.stderr) if "error" in p), None)
            assert error is not None, (args[-4:], done.returncode, done.stdout[-2000:], done.stderr[-2000:])
            got["protocolError"] = {"code": None, "message": error.get("message", "")}
            return got
        if "read" in step:
            got["contents"] = [{"uri": c.get("uri"), "mimeType": c.get("mimeType"), "text": c.get("text")} for c in result["contents"]]
            return got
        got["isError"] = bool(result.get("isError", False))
        got["structured"] = result.get("structuredContent")
        got["text"] = "".join(b["text"] for b in result["content"] if b.get("type") == "text")
        got["images"] = [b.get("mimeType") for b in result["content"] if b.get("type") == "image"]
        got["links"] = [b.get("uri") for b in result["content"] if b.get("type") == "resource_link"]
        return got

    return run_scenarios(step_runner, scenarios)


@pytest.fixture(scope="module")
def reports(snakebox_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """The report of a driver, made the first time it is asked for: its own server (and data
    directory, so one client's leftovers never meet another's scenarios), stopped after."""
    if not (CLIENTS / "node").exists():
        pytest.fail("the real MCP clients are not installed: run scripts/install-clients")
    made: dict[str, dict[str, Any]] = {}
    failed: dict[str, BaseException] = {}

    def report(driver: str) -> dict[str, Any]:
        if driver in failed:  # one failed run fails each of its scenarios, without rerunning
            raise failed[driver]
        try:
            return made[driver] if driver in made else make(driver)
        except Exception as error:
            failed[driver] = error
            raise

    def make(driver: str) -> dict[str, Any]:
        root = tmp_path_factory.mktemp(f"matrix-{driver}")
        data = root / "data"
        key = make_key(snakebox_bin, data, "matrix")
        runnable = [s for s in SCENARIOS.values() if not set(s.get("needs", [])) & set(CANNOT.get(driver, {}))]
        with http_server(snakebox_bin, data, "--max-sessions", "1") as (proc, url):
            if driver == "python_sdk":
                made[driver] = python_sdk_report(url, key, runnable)
            elif driver == "typescript_sdk":
                made[driver] = typescript_sdk_report(url, key, root / "home")
            else:
                made[driver] = inspector_report(url, key, root / "home", runnable)
            assert proc.poll() is None, f"the server died under {driver}"
        return made[driver]

    return report


# --- the judge ---------------------------------------------------------------------------


def judge(scenario: dict[str, Any], ran: dict[str, Any]) -> None:
    """Assert every step's expectations against what the client reported."""
    saved = ran["saved"]
    assert len(ran["steps"]) == len(scenario["steps"]), ran
    for index, (step, got) in enumerate(zip(scenario["steps"], ran["steps"])):
        expect = fill(step["expect"], saved)
        where = f"{scenario['name']} step {index} ({step.get('tool', 'read')}): {json.dumps(got)[:3000]}"
        if "protocol_error" in expect:
            want = expect["protocol_error"]
            assert got["protocolError"] is not None, where
            assert want["message_contains"] in got["protocolError"]["message"], where
            if got["protocolError"]["code"] is not None:
                assert got["protocolError"]["code"] == want["code"], where
            continue
        assert got["protocolError"] is None, where
        if "contents_text" in expect:
            assert [c["text"] for c in got["contents"]] == [expect["contents_text"]], where
            continue
        if "ok" in expect:
            assert got["isError"] is False, where
        if "is_error" in expect:
            assert got["isError"] is True, where
        for path, value in expect.get("structured", {}).items():
            assert got["structured"] is not None and dig(got["structured"], path) == value, (path, where)
        for part in expect.get("text_contains", []):
            assert part in got["text"], (part, where)
        if "images" in expect:
            assert got["images"] == expect["images"], where
        for end in expect.get("links_end_with", []):
            assert any(link.endswith(end) for link in got["links"]), (end, where)
        if "progress_text" in expect:
            # Printed lines arrived as progress notifications (however the lines were cut).
            assert got["progress"] and "".join(got["progress"]) == expect["progress_text"], where
        if "error" in expect:
            # A session tool's error: `isError`, no structured content, and the text a
            # model reads says the kind, the message and the hint.
            want = expect["error"]
            assert got["isError"] is True and got["structured"] is None, where
            said = error_from_text(got["text"])
            assert said["kind"] == want["kind"], where
            assert want["message_contains"] in said["message"], where
            assert said["hint"] is not None and said["hint"].startswith(want["hint_starts"]), where
        if "run_error" in expect:
            # A run that could not start: the structured error, and the same message and
            # hint in the text a model reads.
            want = expect["run_error"]
            assert got["isError"] is True and got["structured"] is not None, where
            error = got["structured"]["error"]
            assert got["structured"]["status"] == want["status"] and error["kind"] == want["kind"], where
            assert want["message_contains"] in error["message"], where
            assert error["hint"] is not None and error["hint"].startswith(want["hint_starts"]), where
            assert error["message"] in got["text"] and f"hint: {error['hint']}\n" in got["text"], where


@pytest.mark.parametrize("scenario", list(SCENARIOS))
@pytest.mark.parametrize("driver", DRIVERS)
def test_the_scenario_through_the_client(reports: Callable[[str], dict[str, Any]], driver: str, scenario: str):
    spec = SCENARIOS[scenario]
    missing = set(spec.get("needs", [])) & set(CANNOT.get(driver, {}))
    if missing:
        pytest.skip("; ".join(CANNOT[driver][need] for need in sorted(missing)))
    judge(spec, reports(driver)[scenario])


def test_every_tool_has_an_error_scenario(reports: Callable[[str], dict[str, Any]]):
    """The list keeps up with the server: every tool it lists has a scenario for its error path."""
    tools = reports("python_sdk")["__tools__"]
    assert "execute_python" in tools and "list_files" in tools, tools
    missing = [tool for tool in tools if not any(name.startswith(f"error_{tool}_") for name in SCENARIOS)]
    assert not missing, missing


def test_the_judge_notices_a_lost_hint(reports: Callable[[str], dict[str, Any]]):
    """The judge can fail: the Python SDK's report with a hint, a message, an error's kind, an
    image or the progress cut is refused."""
    report = reports("python_sdk")
    mangles = [
        ("error_list_files_unknown_session", lambda got: got.update(text=got["text"].split("\nhint: ")[0] + "\n")),
        ("error_execute_python_invalid_argument",
         lambda got: got.update(text=got["text"].replace("hint: ", "note: "))),
        ("error_execute_python_misspelled_argument",
         lambda got: got["protocolError"].update(message="Invalid params")),
        ("image", lambda got: got.update(images=[])),
        ("progress", lambda got: got.update(progress=[])),
        ("error_delete_session_unknown_session", lambda got: got.update(text=got["text"].replace("error (not_found)", "error (internal)"))),
    ]
    for name, mangle in mangles:
        judge(SCENARIOS[name], report[name])
        broken = copy.deepcopy(report[name])
        mangle(broken["steps"][0])
        with pytest.raises(AssertionError):
            judge(SCENARIOS[name], broken)
