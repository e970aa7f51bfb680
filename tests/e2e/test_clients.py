"""Real clients against `snakebox serve --http` (issue 14): the official TypeScript SDK over
streamable HTTP and legacy SSE, the Inspector CLI, supergateway relaying legacy SSE to stdio
(how seed 002's Claude Desktop users connect), and the agent CLIs' own health checks
(`claude mcp list`, `gemini mcp list`) — each with an API key, and each refused without one.

The clients are the npm packages pinned in tests/clients/package.json, installed into
target/clients by scripts/install-clients (scripts/test runs it), with the Node.js 22 they
need from the same place. Nothing here talks to anything but the server on loopback.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import uuid
from pathlib import Path
from typing import Iterator

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client

from conftest import REPO, call, have_bwrap
from http_support import http_server, make_key

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

CLIENTS = REPO / "target" / "clients" / "node_modules" / ".bin"


@pytest.fixture(scope="module")
def served(snakebox_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, str]]:
    """One server with one tenant's key: (base URL, key)."""
    if not (CLIENTS / "node").exists():
        pytest.fail("the real MCP clients are not installed: run scripts/install-clients")
    data = tmp_path_factory.mktemp("clients") / "data"
    key = make_key(snakebox_bin, data, "clients")
    with http_server(snakebox_bin, data) as (proc, url):
        yield url, key
        assert proc.poll() is None, "the server died under the clients"


def client_env(home: Path, **extra: str) -> dict[str, str]:
    """The clients' environment: their own Node first on PATH, a fresh HOME for their config."""
    home.mkdir(parents=True, exist_ok=True)
    return {
        "PATH": f"{CLIENTS}:{os.environ.get('PATH', '/usr/bin:/bin')}",
        "HOME": str(home),
        "NO_COLOR": "1",
        "NODE_PATH": str(CLIENTS.parent),
        **extra,
    }


def run_client(args: list[str], env: dict[str, str], cwd: Path, timeout: int = 180) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout)


@pytest.mark.parametrize("transport", ["http", "sse"])
def test_typescript_sdk_runs_a_script_a_session_and_reads_an_artifact(served: tuple[str, str], tmp_path: Path, transport: str):
    url, key = served
    marker = uuid.uuid4().hex
    # The script imports the SDK from target/clients: run it from there.
    script = REPO / "tests" / "clients" / "ts_sdk_flow.mjs"
    work = CLIENTS.parent.parent / f"flow-{uuid.uuid4().hex}.mjs"
    work.write_text(script.read_text())
    try:
        done = run_client(["node", str(work), transport, url, key, marker], client_env(tmp_path / "home"), CLIENTS.parent.parent)
    finally:
        work.unlink()
    assert done.returncode == 0, done.stderr[-3000:]
    # The schemas are plain: Ajv in the SDK warned about `uint`/`uint64` formats on every
    # connect (issue 16 (3)); it says nothing now, about any schema.
    for ajv_warning in ("unknown format", "strict mode", "ignored in schema", "unknown keyword"):
        assert ajv_warning not in done.stderr, done.stderr[:2000]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["server"]["name"] == "snakebox"
    assert {"execute_python", "create_session", "check_environment"} <= set(report["tools"])
    run = report["run"]
    assert run["status"] == "ok" and run["stdout"].count(marker) == 3, run
    # Printed lines arrived as progress notifications while the script ran.
    assert report["progress"] == [f"{marker} {i}\n" for i in range(3)], report["progress"]
    assert report["runLinks"] and report["runLinks"][0].startswith("snakebox://artifacts/")
    assert report["artifactText"] == "from ts"
    assert report["cell"]["result"]["json"] == 42, report["cell"]
    # A tool that cannot do what was asked: an error result the SDK accepts, with the kind,
    # the message and the hint intact.
    gone = report["errorResult"]
    assert gone["isError"] is True, gone
    assert gone["text"].startswith("error (not_found): ") and "\nhint: " in gone["text"], gone
    # Every tool, called as a model bound by the published schemas calls it (every argument
    # present, `null` for those not given): each worked, and each structured result passed
    # the SDK's check against the tool's output schema (it throws otherwise).
    # (install_packages needs a package index: its schemas are held to the same rules by the
    # Rust test in crates/snakebox-server/src/schemas/rules.rs.)
    strict = report["strict"]
    assert set(strict) == set(report["listedTools"]) - {"install_packages"}, sorted(strict)
    for name, outcome in strict.items():
        assert outcome["isError"] is False and outcome["structured"], (name, outcome)
    assert strict["execute_python"]["structured"]["stdout"] == "strict\n", strict["execute_python"]
    assert strict["execute_python"]["structured"]["session_id"] is None
    assert strict["read_file"]["structured"]["content"] == "abc", strict["read_file"]
    assert strict["run_command"]["structured"]["stdout"] == "abc", strict["run_command"]
    assert [e["path"] for e in strict["list_files"]["structured"]["entries"]] == ["in.txt"], strict["list_files"]


def test_inspector_cli_lists_and_calls_tools_with_a_key(served: tuple[str, str], tmp_path: Path):
    url, key = served
    env = client_env(tmp_path / "home")
    inspector = ["mcp-inspector", "--cli"]
    header = ["--header", f"Authorization: Bearer {key}"]

    listed = run_client([*inspector, f"{url}/mcp", "--transport", "http", *header, "--method", "tools/list"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr[-3000:]
    names = {tool["name"] for tool in json.loads(listed.stdout)["tools"]}
    assert {"execute_python", "list_sessions"} <= names

    for target, extra in ((f"{url}/mcp", ["--transport", "http", *header]), (f"{url}/sse?api_key={key}", ["--transport", "sse"])):
        called = run_client(
            [*inspector, target, *extra, "--method", "tools/call", "--tool-name", "execute_python",
             "--tool-arg", "script=print(6 * 7)"],
            env, tmp_path,
        )
        assert called.returncode == 0, (target, called.stderr[-3000:])
        result = json.loads(called.stdout)
        assert result["structuredContent"]["status"] == "ok", result
        assert result["structuredContent"]["stdout"] == "42\n", result

    # With a wrong key the Inspector fails: it takes the 401's Bearer challenge as "needs
    # authorization" (and, having no TTY, does not start an OAuth flow).
    refused = run_client([*inspector, f"{url}/mcp", "--transport", "http", "--header", "Authorization: Bearer sbx_wrong",
                          "--method", "tools/list", "--stored-auth-only"], env, tmp_path)
    assert refused.returncode != 0
    assert "401" in refused.stdout + refused.stderr or "auth_required" in refused.stdout + refused.stderr, refused


async def test_supergateway_relays_legacy_sse_to_a_stdio_client(served: tuple[str, str], tmp_path: Path):
    url, key = served
    marker = uuid.uuid4().hex
    env = client_env(tmp_path / "home")
    params = StdioServerParameters(command=str(CLIENTS / "supergateway"), args=["--sse", f"{url}/sse?api_key={key}", "--logLevel", "none"], env=env)
    async with Client(stdio_client(params), read_timeout_seconds=300) as client:
        tools = await client.list_tools()
        assert any(tool.name == "execute_python" for tool in tools.tools)
        result, text, is_error = await call(client, "execute_python", script=f"print('{marker}')")
        assert not is_error and result["stdout"] == f"{marker}\n", text


def test_claude_code_lists_the_server_connected(served: tuple[str, str], tmp_path: Path):
    url, key = served
    env = client_env(tmp_path / "home")
    for name, transport, target, header in (
        ("sbx-http", "http", f"{url}/mcp", ["--header", f"Authorization: Bearer {key}"]),
        ("sbx-sse", "sse", f"{url}/sse?api_key={key}", []),
        ("sbx-badkey", "http", f"{url}/mcp", ["--header", "Authorization: Bearer sbx_wrong"]),
    ):
        added = run_client(["claude", "mcp", "add", "--scope", "user", "--transport", transport, name, target, *header], env, tmp_path)
        assert added.returncode == 0, (name, added.stdout, added.stderr)
    listed = run_client(["claude", "mcp", "list"], env, tmp_path)
    lines = {line.split(":", 1)[0]: line for line in listed.stdout.splitlines() if line.startswith("sbx-")}
    assert "Connected" in lines.get("sbx-http", ""), listed.stdout
    assert "Connected" in lines.get("sbx-sse", ""), listed.stdout
    assert "Connected" not in lines.get("sbx-badkey", "Connected") and "401" in lines["sbx-badkey"], listed.stdout


def test_gemini_cli_lists_the_server_connected(served: tuple[str, str], tmp_path: Path):
    url, key = served
    # The CLI shows user-level servers only in a trusted folder.
    env = client_env(tmp_path / "home", GEMINI_CLI_TRUST_WORKSPACE="true")
    for name, args in (
        ("sbx-http", ["-t", "http", "-H", f"Authorization: Bearer {key}", "sbx-http", f"{url}/mcp"]),
        ("sbx-sse", ["-t", "sse", "sbx-sse", f"{url}/sse?api_key={key}"]),
        ("sbx-badkey", ["-t", "http", "-H", "Authorization: Bearer sbx_wrong", "sbx-badkey", f"{url}/mcp"]),
    ):
        added = run_client(["gemini", "mcp", "add", "-s", "user", *args], env, tmp_path)
        assert added.returncode == 0, (name, added.stdout, added.stderr)
    listed = run_client(["gemini", "mcp", "list"], env, tmp_path)
    text = listed.stdout + listed.stderr
    lines = {name: line for line in text.splitlines() for name in ("sbx-http", "sbx-sse", "sbx-badkey") if f" {name}:" in line}
    assert "Connected" in lines.get("sbx-http", ""), text
    assert "Connected" in lines.get("sbx-sse", ""), text
    assert "Connected" not in lines.get("sbx-badkey", "Connected"), text


def client_config(snakebox_bin: Path, *args: str) -> str:
    done = subprocess.run([str(snakebox_bin), "client-config", *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_client_config_snippets_connect_the_real_agent_clients(snakebox_bin: Path, served: tuple[str, str], tmp_path: Path):
    """`snakebox client-config` (issue 36): what it prints for Claude Code (a command) and
    Gemini CLI (a settings file), over stdio (this binary by its absolute path) and over HTTP
    with a key, connects each real client: its own health check says `Connected`."""
    url, key = served
    env = client_env(tmp_path / "claude-home")
    for name, args in (("stdio", []), ("http", ["--http", url, "--key", key])):
        command = client_config(snakebox_bin, "claude-code", *args).strip()
        command = command.replace(" snakebox ", f" sbx-{name} ", 1)  # the name, not the path
        added = run_client(["sh", "-c", command], env, tmp_path)
        assert added.returncode == 0, (command, added.stdout, added.stderr)
    listed = run_client(["claude", "mcp", "list"], env, tmp_path, timeout=300)
    lines = {line.split(":", 1)[0]: line for line in listed.stdout.splitlines() if line.startswith("sbx-")}
    assert "Connected" in lines.get("sbx-stdio", ""), listed.stdout
    assert "Connected" in lines.get("sbx-http", ""), listed.stdout

    home = tmp_path / "gemini-home"
    env = client_env(home, GEMINI_CLI_TRUST_WORKSPACE="true")
    servers = {}
    for name, args in (("stdio", []), ("http", ["--http", url, "--key", key])):
        servers[f"sbx-{name}"] = json.loads(client_config(snakebox_bin, "gemini", *args))["mcpServers"]["snakebox"]
    assert servers["sbx-stdio"]["command"] == str(snakebox_bin.resolve())
    (home / ".gemini").mkdir(parents=True)
    (home / ".gemini" / "settings.json").write_text(json.dumps({"mcpServers": servers}))
    listed = run_client(["gemini", "mcp", "list"], env, tmp_path, timeout=300)
    text = listed.stdout + listed.stderr
    lines = {name: line for line in text.splitlines() for name in servers if f" {name}:" in line}
    assert "Connected" in lines.get("sbx-stdio", ""), text
    assert "Connected" in lines.get("sbx-http", ""), text


class FakeGemini(http.server.ThreadingHTTPServer):
    """A model API on 127.0.0.1 speaking Gemini's `streamGenerateContent`: its first answer
    calls `execute_python` with `args`, its second says `done`. Keeps every request body."""

    def __init__(self, args: dict) -> None:
        self.args = args
        self.bodies: list[dict] = []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))) or b"{}")
                outer.bodies.append(body)
                names = [f["name"] for t in body.get("tools", []) for f in t.get("functionDeclarations", [])]
                tool = next((n for n in names if n.endswith("execute_python")), None)
                answered = any("functionResponse" in p for c in body.get("contents", []) for p in c.get("parts", []))
                part = {"functionCall": {"name": tool, "args": outer.args}} if tool and not answered else {"text": "done"}
                chunk = {"candidates": [{"content": {"role": "model", "parts": [part]}, "finishReason": "STOP", "index": 0}],
                         "usageMetadata": {"promptTokenCount": 1, "candidatesTokenCount": 1, "totalTokenCount": 2}}
                data = (f"data: {json.dumps(chunk)}\n\n" if "alt=sse" in self.path else json.dumps(chunk)).encode()
                self.send_response(200)
                self.send_header("content-type", "text/event-stream" if "alt=sse" in self.path else "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args: object) -> None:
                pass

        super().__init__(("127.0.0.1", 0), Handler)


OPTIONAL_EXECUTE_ARGUMENTS = ("dependencies", "timeout_seconds", "python_version", "files", "session_id", "network",
                              "allowed_domains", "allowed_imports", "profile", "memory_limit")


@pytest.mark.parametrize("style", ["only_what_is_required", "nulls_for_the_rest"])
def test_gemini_cli_calls_a_tool_the_way_its_schema_says(served: tuple[str, str], tmp_path: Path, style: str):
    """Gemini CLI hands snakebox's input schema to the model as it is (`parametersJsonSchema`)
    and checks the model's arguments against it (Ajv) before calling. A model may give only the
    required `script`, or (as OpenAI's strict mode makes it) every argument with `null` for
    those it does not mean (Gemini CLI adds `wait_for_previous`): either way the call passes the
    CLI's check and runs (issue 16 (2), (3))."""
    url, key = served
    marker = uuid.uuid4().hex
    nulls = {name: None for name in OPTIONAL_EXECUTE_ARGUMENTS} if style == "nulls_for_the_rest" else {}
    model = FakeGemini({"script": f"print('{marker}')", **nulls, "wait_for_previous": False})
    threading.Thread(target=model.serve_forever, daemon=True).start()
    try:
        home = tmp_path / "home"
        env = client_env(home, GEMINI_CLI_TRUST_WORKSPACE="true", GEMINI_API_KEY="not-a-key",
                         GOOGLE_GEMINI_BASE_URL=f"http://127.0.0.1:{model.server_address[1]}")
        added = run_client(["gemini", "mcp", "add", "-s", "user", "-t", "http", "-H", f"Authorization: Bearer {key}", "sbx", f"{url}/mcp"], env, tmp_path)
        assert added.returncode == 0, added.stderr
        settings = home / ".gemini" / "settings.json"
        config = json.loads(settings.read_text())
        config.setdefault("security", {}).setdefault("auth", {})["selectedType"] = "gemini-api-key"
        settings.write_text(json.dumps(config))
        (tmp_path / "work").mkdir()
        done = run_client(["gemini", "-p", "run it", "--yolo", "-m", "gemini-2.5-flash"], env, tmp_path / "work")
    finally:
        model.shutdown()
    assert done.returncode == 0, done.stderr[-3000:]
    assert "params must have" not in done.stderr, done.stderr[-3000:]
    declared = next(f for b in model.bodies for t in b.get("tools", []) for f in t.get("functionDeclarations", [])
                    if f["name"].endswith("execute_python"))
    schema = declared["parametersJsonSchema"]
    assert schema["required"] == ["script"] and schema["additionalProperties"] is False, schema
    for name in OPTIONAL_EXECUTE_ARGUMENTS:
        assert {"type": "null"} in schema["properties"][name]["anyOf"], (name, schema["properties"][name])
    responses = [p["functionResponse"] for b in model.bodies for c in b.get("contents", []) for p in c.get("parts", [])
                 if "functionResponse" in p]
    assert responses, model.bodies[-1]
    output = json.dumps(responses[-1])
    assert f"{marker}\\n" in output and "exit_code: 0" in output, output


def test_the_official_conformance_suite_passes_what_applies(snakebox_bin: Path, tmp_path: Path):
    """The MCP conformance suite's server scenarios against the fixtures of the hidden
    `--conformance-fixtures` flag. Those that do not apply to snakebox are the baseline
    (tests/clients/conformance-not-applicable.yml, each with why): one of them passing fails
    the run too, so the list stays true."""
    if not (CLIENTS / "conformance").exists():
        pytest.fail("the real MCP clients are not installed: run scripts/install-clients")
    baseline = REPO / "tests" / "clients" / "conformance-not-applicable.yml"
    with http_server(snakebox_bin, tmp_path / "data", "--conformance-fixtures") as (proc, url):
        done = run_client(
            ["conformance", "server", "--url", f"{url}/mcp", "--expected-failures", str(baseline)],
            client_env(tmp_path / "home"), tmp_path, timeout=600,
        )
        assert proc.poll() is None
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-4000:]
    assert "Baseline check passed" in output, output[-4000:]
    # What snakebox does is among what passed: content of every kind, errors, progress,
    # resources, and the DNS-rebinding guard.
    for scenario in ("tools-call-image", "tools-call-error", "tools-call-with-progress",
                     "resources-read-binary", "dns-rebinding-protection"):
        assert f"✓ {scenario}:" in output, (scenario, output[-4000:])
