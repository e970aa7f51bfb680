"""The tool set of python-mcp-sandbox (issue 36; seed 002): with `serve --compat-tools
python-mcp-sandbox`, its README's example prompt runs end to end with its tool names and
argument names, and the answers have its keys.

The prompt's workflow: `list_sandboxes`, `create_sandbox` when there is none, then
`install_package_in_sandbox(sandbox_id, package_name)`, `check_package_installation_status`
until installed, `execute_python_code(sandbox_id, code)` whose saved files come back as
`files` and `file_links`; beside it the README's `execute_terminal_command(sandbox_id,
command)` (stdout, stderr, exit_code) and `upload_file_to_sandbox(sandbox_id, local_file_path,
dest_path)`, which reads only under the operator's `--upload-dirs`.

The packages come from a local index (`UV_INDEX_URL`), so the test needs no PyPI: `pandas` is a
small stand-in wheel with the one method the example uses (`DataFrame.to_csv`).
"""

from __future__ import annotations

import asyncio
import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from conftest import call, connect, have_bwrap
from test_builds import Index, wheel_bytes

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

TOOLS = {"create_sandbox", "list_sandboxes", "execute_python_code", "install_package_in_sandbox",
         "check_package_installation_status", "execute_terminal_command", "upload_file_to_sandbox"}

PANDAS = '''
__version__ = "2.2.0"

class DataFrame:
    def __init__(self, data):
        self.data = data

    def to_csv(self, path, index=False):
        with open(path, "w") as out:
            out.write(",".join(self.data) + "\\n")
            for row in zip(*self.data.values()):
                out.write(",".join(map(str, row)) + "\\n")
'''


@pytest.fixture(scope="module")
def index() -> Any:
    idx = Index("user", f"tok-{secrets.token_hex(6)}")
    idx.add(wheel_bytes("pandas", "2.2.0", {"pandas/__init__.py": PANDAS}))
    yield idx
    idx.close()


def fresh(path: Path) -> Path:
    path.mkdir(parents=True)
    path.chmod(0o755)
    return path


async def installed(client: Any, sandbox_id: str, package: str) -> dict[str, Any]:
    """check_package_installation_status until the install ends, as the prompt says to."""
    for _ in range(60):
        data, text, _ = await call(client, "check_package_installation_status", sandbox_id=sandbox_id, package_name=package)
        if data["status"] != "installing":
            return data
        assert data["success"] is None and data["complete"] is False, text
        await asyncio.sleep(1)
    raise AssertionError(f"{package} still installing")


async def test_the_readme_workflow_of_python_mcp_sandbox(snakebox_bin, tmp_path, index, mode):
    uploads = fresh(tmp_path / "uploads")
    (uploads / "data.csv").write_text("x,y\n1,2\n3,4\n")
    secret = tmp_path / "secret.txt"
    secret.write_text("not for the sandbox")
    (uploads / "escape").symlink_to(secret)
    async with connect(snakebox_bin, fresh(tmp_path / "data"), mode, "--compat-tools", "python-mcp-sandbox",
                       "--upload-dirs", str(uploads), env={"UV_INDEX_URL": index.url}) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
        assert TOOLS <= names and "execute_python" in names and "execute_code" not in names, names

        # 1. list_sandboxes first; none yet, so create_sandbox; the id is what every other call takes.
        data, _, _ = await call(client, "list_sandboxes")
        assert data["sandboxes"] == [], data
        data, text, is_error = await call(client, "create_sandbox")
        assert not is_error and data["sandbox_id"] and json.loads(text)["sandbox_id"] == data["sandbox_id"], text
        sandbox_id = data["sandbox_id"]
        data, _, _ = await call(client, "list_sandboxes")
        assert [s["sandbox_id"] for s in data["sandboxes"]] == [sandbox_id], data
        assert {"status", "installed_packages", "python_version"} <= set(data["sandboxes"][0])

        # 2. install_package_in_sandbox(sandbox_id, package_name): success, or installing.
        data, text, is_error = await call(client, "install_package_in_sandbox", sandbox_id=sandbox_id, package_name="pandas")
        assert not is_error and data["status"] in ("success", "installing"), text
        assert data["success"] is (True if data["status"] == "success" else None)
        # 3. check_package_installation_status until it is installed.
        data = await installed(client, sandbox_id, "pandas")
        assert data["success"] is True and data["status"] == "success" and data["version"] == "2.2.0", data
        data, _, _ = await call(client, "check_package_installation_status", sandbox_id=sandbox_id, package_name="seaborn")
        assert data["success"] is False and data["status"] == "not_installed", data
        data, _, _ = await call(client, "list_sandboxes")
        assert "pandas==2.2.0" in data["sandboxes"][0]["installed_packages"], data

        # 4. execute_python_code(sandbox_id, code): output, errors and links to the saved files.
        code = "import pandas as pd\ndf = pd.DataFrame({'a': [1, 2]})\ndf.to_csv('out.csv')\nprint(pd.__version__)"
        data, text, is_error = await call(client, "execute_python_code", sandbox_id=sandbox_id, code=code)
        assert not is_error and data["stdout"] == "2.2.0\n" and data["stderr"] == "" and data["exit_code"] == 0, text
        assert data["files"] == ["out.csv"], data
        # On stdio there is no HTTP server: each link is the file's resource URI.
        assert len(data["file_links"]) == 1 and data["file_links"][0].startswith("snakebox://artifacts/"), data
        assert data["file_links"][0].endswith("/out.csv")
        # A sandbox keeps its state between calls.
        await call(client, "execute_python_code", sandbox_id=sandbox_id, code="x = 41")
        data, _, _ = await call(client, "execute_python_code", sandbox_id=sandbox_id, code="print(x + 1)")
        assert data["stdout"] == "42\n" and data["files"] == [], data
        # An exception: a non-zero exit code and the traceback in stderr.
        data, _, _ = await call(client, "execute_python_code", sandbox_id=sandbox_id, code="1/0")
        assert data["exit_code"] != 0 and "ZeroDivisionError" in data["stderr"], data

        # execute_terminal_command(sandbox_id, command): stdout, stderr, exit_code.
        data, text, _ = await call(client, "execute_terminal_command", sandbox_id=sandbox_id,
                                   command="ls; echo oops >&2; exit 3")
        assert "out.csv" in data["stdout"].split() and data["stderr"] == "oops\n" and data["exit_code"] == 3, text
        assert set(data) == {"stdout", "stderr", "exit_code"}

        # upload_file_to_sandbox(sandbox_id, local_file_path[, dest_path]): into /app/results,
        # the code's working directory, by default.
        data, text, is_error = await call(client, "upload_file_to_sandbox", sandbox_id=sandbox_id,
                                          local_file_path=str(uploads / "data.csv"))
        assert not is_error and data["success"] is True and data["dest_path"] == "/app/results/data.csv", text
        assert data["size"] == 12
        data, _, _ = await call(client, "upload_file_to_sandbox", sandbox_id=sandbox_id,
                                local_file_path=str(uploads / "data.csv"), dest_path="/app/results/inputs")
        assert data["dest_path"] == "/app/results/inputs/data.csv" and data["path"] == "inputs/data.csv", data
        data, _, _ = await call(client, "execute_python_code", sandbox_id=sandbox_id,
                                code="print(open('data.csv').read() == open('inputs/data.csv').read() == 'x,y\\n1,2\\n3,4\\n')")
        assert data["stdout"] == "True\n", data
        # Only under --upload-dirs: not a file outside, nor a symlink out of it.
        for path in [secret, uploads / "escape", uploads / ".." / "secret.txt"]:
            data, text, is_error = await call(client, "upload_file_to_sandbox", sandbox_id=sandbox_id, local_file_path=str(path))
            assert is_error and "not under a directory this server lets uploads read" in data["error"]["message"], text
            assert str(uploads.resolve()) in data["error"]["hint"], text
        data, _, _ = await call(client, "execute_terminal_command", sandbox_id=sandbox_id, command="ls")
        assert "secret.txt" not in data["stdout"] and "escape" not in data["stdout"], data
        # A dest_path outside the working directory is refused.
        data, text, is_error = await call(client, "upload_file_to_sandbox", sandbox_id=sandbox_id,
                                          local_file_path=str(uploads / "data.csv"), dest_path="/etc")
        assert is_error and "outside the sandbox's working directory" in data["error"]["message"], text

        # A sandbox that does not exist: an error with the fix, in that tool's shape.
        data, text, is_error = await call(client, "execute_python_code", sandbox_id="no-such-sandbox", code="print(1)")
        assert is_error and data["exit_code"] != 0 and data["error"] and "hint" in data["error"], text
        data, text, is_error = await call(client, "install_package_in_sandbox", sandbox_id="no-such-sandbox", package_name="pandas")
        assert is_error and data["error"]["hint"], text


async def test_uploads_read_nothing_unless_the_operator_allows_a_directory(snakebox_bin, tmp_path):
    local = tmp_path / "data.csv"
    local.write_text("x\n")
    async with connect(snakebox_bin, fresh(tmp_path / "data"), "auto", "--compat-tools", "python-mcp-sandbox") as client:
        data, _, _ = await call(client, "create_sandbox", name="uploads")
        data, text, is_error = await call(client, "upload_file_to_sandbox", sandbox_id=data["sandbox_id"], local_file_path=str(local))
        assert is_error and "reads no host file on this server" in data["error"]["message"], text
        assert "--upload-dirs" in data["error"]["hint"], text


async def test_its_sse_configuration_with_a_key_in_the_url_gets_http_file_links(snakebox_bin, tmp_path):
    """Its README's client configuration: `supergateway --sse http://HOST/sse?api_key=KEY`. The
    SDK's SSE client given that URL runs the workflow, and the saved files' `file_links` are
    HTTP links a plain GET downloads, without the key."""
    from mcp import Client
    from mcp.client.sse import sse_client

    from http_support import http_server, make_key
    from test_http import plain_get

    data = fresh(tmp_path / "data")
    key = make_key(snakebox_bin, data, "me")
    with http_server(snakebox_bin, data, "--compat-tools", "python-mcp-sandbox") as (_, url):
        async with Client(sse_client(f"{url}/sse?api_key={key}"), mode="legacy", read_timeout_seconds=120) as client:
            created, _, _ = await call(client, "create_sandbox")
            data_, text, is_error = await call(client, "execute_python_code", sandbox_id=created["sandbox_id"],
                                               code="open('table.csv', 'w').write('a,b\\n1,2\\n')\nprint('saved')")
            assert not is_error and data_["stdout"] == "saved\n" and data_["files"] == ["table.csv"], text
            link = data_["file_links"][0]
            assert link.startswith(f"{url}/"), link
            status, _, body = plain_get(link)
            assert (status, body) == (200, b"a,b\n1,2\n"), (status, body)
            listed, _, _ = await call(client, "list_sandboxes")
            assert [s["sandbox_id"] for s in listed["sandboxes"]] == [created["sandbox_id"]]
