"""The compatibility tool set of IBM's python sandbox server (issue 18; seed 003): with
`serve --compat-tools`, its documented examples — requests and responses of its README — work
unchanged through `execute_code`, `validate_code` and `get_sandbox_info`, under the `basic`
profile that server uses by default.

- `result` is the value of the variable `result` (that server's meaning) and
  `last_expression` snakebox's (the last expression's value); `variables` lists the names;
- `use_container` is refused with the reason on a server without containers;
- `validate_code` reports a disallowed import as `Line N: Import 'x' is not allowed`;
- `get_sandbox_info` lists the four tiers with their modules, the limits and container mode;
- without the flag the tools are not served.
"""

from __future__ import annotations

import json

import pytest

from conftest import call, connect, docker_backend, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

FIBONACCI = """
def fibonacci(n):
    if n <= 1:
        return n
    return fibonacci(n-1) + fibonacci(n-2)

result = [fibonacci(i) for i in range(10)]
print("Fibonacci sequence:", result)
"""

STATISTICS = """
import statistics
data = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10]
mean = statistics.mean(data)
median = statistics.median(data)
stdev = statistics.stdev(data)
result = {
    'mean': mean,
    'median': median,
    'std_dev': stdev
}
print(f"Statistics: {result}")
"""

BUBBLE = """
def bubble_sort(arr):
    n = len(arr)
    for i in range(n):
        for j in range(0, n-i-1):
            if arr[j] > arr[j+1]:
                arr[j], arr[j+1] = arr[j+1], arr[j]
    return arr

test_data = [64, 34, 25, 12, 22, 11, 90]
result = bubble_sort(test_data.copy())
print(f"Sorted: {result}")
"""

PI = """
import math

def calculate_pi_leibniz(terms):
    pi_approx = 0
    for i in range(terms):
        pi_approx += ((-1) ** i) / (2 * i + 1)
    return pi_approx * 4

result = calculate_pi_leibniz(1000)
print(f"Pi approximation: {result}")
print(f"Difference from math.pi: {abs(result - math.pi)}")
"""


async def test_the_readme_examples_of_the_python_sandbox_server(snakebox_bin, tmp_path, mode):
    # As an IBM user starts it: its tool set alone runs its Basic tier by default (issue 36).
    async with connect(snakebox_bin, tmp_path / "data", mode, "--compat-tools") as client:
        # Basic Code Execution: the documented request and response.
        data, text, is_error = await call(client, "execute_code", code="result = 2 + 2\nprint(f'The answer is: {result}')",
                                          timeout=10, capture_output=True)
        assert not is_error
        assert data["success"] is True and data["result"] == 4, data
        assert data["stdout"] == "The answer is: 4\n" and data["stderr"] == ""
        assert data["variables"] == ["result"] and data["last_expression"] is None
        assert isinstance(data["execution_time"], float) and data["execution_id"]
        assert data["profile"] == "basic"
        assert json.loads(text)["result"] == 4  # clients that read the text get the same JSON

        # Data Analysis Example.
        data, _, _ = await call(client, "execute_code",
                                code="import math\ndata = [1, 2, 3, 4, 5]\nresult = sum(data) / len(data)\nprint(f'Average: {result}')",
                                allowed_imports=["math"], timeout=15)
        assert data["success"] and data["result"] == 3.0 and data["stdout"] == "Average: 3.0\n", data

        # Container-Based Execution (and Container Mode with Custom Limits): natively there are
        # no containers, so the request is refused with the reason and the fix, before anything
        # runs; on the docker backend it is honoured, and the call meets the `basic` profile like
        # any other: numpy is outside its import policy, 512m above its memory limit.
        for code, memory, refusal in [("import numpy as np\ndata = np.array([1, 2, 3, 4, 5])\nresult = np.mean(data)", "256m", "import_blocked"),
                                      ("import numpy as np; data = np.random.rand(1000, 1000)", "512m", "policy_refused")]:
            data, text, is_error = await call(client, "execute_code", code=code, use_container=True,
                                              memory_limit=memory, timeout=30)
            if docker_backend():
                assert is_error and data["status"] == "invalid_request" and data["success"] is False, text
                assert [e["kind"] for e in data["events"]] == [refusal], data["events"]
                assert "profile `basic`" in data["error"] and "use_container" not in data["error"], text
                continue
            assert is_error and data["error"]["kind"] == "invalid", text
            assert "use_container is not available" in data["error"]["message"]
            assert "--sandbox-backend docker" in data["error"]["hint"]

        # Programmatic Usage and the Use Cases.
        data, _, _ = await call(client, "execute_code", code=FIBONACCI)
        assert data["result"] == [0, 1, 1, 2, 3, 5, 8, 13, 21, 34], data
        assert data["stdout"] == "Fibonacci sequence: [0, 1, 1, 2, 3, 5, 8, 13, 21, 34]\n"
        data, _, _ = await call(client, "execute_code", code=STATISTICS)
        assert data["result"] == {"mean": 5.5, "median": 5.5, "std_dev": pytest.approx(3.0276503540974917)}, data
        data, _, _ = await call(client, "execute_code", code=BUBBLE)
        assert data["result"] == [11, 12, 22, 25, 34, 64, 90] and data["stdout"].startswith("Sorted: ["), data
        data, _, _ = await call(client, "execute_code", code=PI)
        assert data["success"] and abs(data["result"] - 3.140592653839794) < 1e-12, data

        # Batch Code Execution.
        answers = [(await call(client, "execute_code", code=code, timeout=5))[0]
                   for code in ["print('Hello, World!')", "result = sum(range(10))", "import math; print(math.pi)"]]
        assert answers[0]["stdout"] == "Hello, World!\n" and answers[0]["result"] is None
        assert answers[1]["result"] == 45
        assert answers[2]["stdout"].startswith("3.14159")
        # Both meanings of "result": the variable, and snakebox's last expression.
        data, _, _ = await call(client, "execute_code", code="result = 'variable'\n6 * 7")
        assert data["result"] == "variable" and data["last_expression"] == 42, data
        # capture_output false returns no output; an exception is an unsuccessful run.
        data, _, _ = await call(client, "execute_code", code="print('x')\n1/0", capture_output=False)
        assert data["success"] is False and data["stdout"] == "" and "ZeroDivisionError" in data["error"], data
        # The profile holds: a subprocess import is refused with its line, as an event.
        data, _, is_error = await call(client, "execute_code", code="import subprocess")
        assert is_error and data["success"] is False and "`subprocess` (line 1)" in data["error"], data
        assert [e["kind"] for e in data["events"]] == ["import_blocked"]

        # Code Validation: the documented response.
        data, _, is_error = await call(client, "validate_code", code="import os; os.system('ls')")
        assert not is_error
        assert data["validation"] == {"valid": False, "errors": ["Line 1: Import 'os' is not allowed"],
                                      "message": "Code contains restricted operations"}, data
        assert data["analysis"] == {"line_count": 1, "character_count": 26, "estimated_complexity": "low"}
        assert any("restricted in sandbox environment" in r for r in data["recommendations"]), data
        data, _, _ = await call(client, "validate_code", code="import math\nprint(math.pi)")
        assert data["validation"] == {"valid": True, "errors": [], "message": "Code is valid"}, data
        data, _, _ = await call(client, "validate_code", code="print('unclosed'")
        assert data["validation"]["valid"] is False and data["validation"]["errors"][0].startswith("Line 1: "), data

        # Get Sandbox Capabilities.
        info, _, _ = await call(client, "get_sandbox_info")
        assert info["success"] is True and info["default_profile"] == "basic"
        profiles = info["security_profiles"]
        assert {"basic", "data_science", "network", "filesystem"} <= set(profiles), profiles
        assert {"math", "random", "datetime", "json", "base64"} <= set(profiles["basic"]["modules"])
        assert {"numpy", "pandas", "scipy", "matplotlib"} <= set(profiles["data_science"]["modules"])
        assert {"httpx", "requests", "urllib.request"} <= set(profiles["network"]["modules"])
        assert {"pathlib", "tempfile", "shutil"} <= set(profiles["filesystem"]["modules"])
        assert all(p["enabled"] for p in profiles.values())  # the local operator may use each
        assert info["resource_limits"] == {"timeout": 30, "max_output_size": 102400, "memory_limit": "256m"}, info
        containers = docker_backend()  # every run is a container there
        assert info["container_mode"] == {"available": containers, "enabled": containers}


async def test_the_compatibility_tools_are_served_only_when_asked_for(snakebox_bin, tmp_path, mode):
    async with connect(snakebox_bin, tmp_path / "data", mode) as client:
        names = {tool.name for tool in (await client.list_tools()).tools}
    assert "execute_python" in names and not names & {"execute_code", "validate_code", "get_sandbox_info"}


async def test_ibms_environment_variables_are_honoured_with_its_tool_set(snakebox_bin, data_dir):
    """Issue 36: a user of IBM's server keeps its `SANDBOX_*` settings when snakebox serves its
    tool set: the timeout, the output cap, the tier (one of snakebox's profiles) and the import
    list fill in what snakebox's own settings leave unset; without --compat-tools they mean
    nothing, and a flag still wins."""
    ibm = {"SANDBOX_TIMEOUT": "12", "SANDBOX_MAX_OUTPUT_SIZE": "4096", "SANDBOX_ENABLE_DATA_SCIENCE": "true",
           "SANDBOX_ALLOWED_IMPORTS": "math,json,numpy", "SANDBOX_CONTAINER_IMAGE": "python-sandbox:latest"}
    async with connect(snakebox_bin, data_dir, "auto", "--compat-tools", env=ibm) as client:
        report, text, _ = await call(client, "check_environment")
        assert report["timeouts"].startswith("default 12 s"), report["timeouts"]
        assert report["default_profile"] == "data_science", text
        profile = next(p for p in report["profiles"] if p["name"] == "data_science")
        assert profile["allowed_imports"] == ["math", "json", "numpy"], profile
        data, text, _ = await call(client, "execute_python", script="print('x' * 10000)")
        assert data["stdout_truncated"] is True and len(data["stdout"]) <= 4096, text
        data, text, _ = await call(client, "execute_python", script="import os")
        assert data["status"] != "ok" and "os" in text, text
        # Its data-science tier ships numpy: here the import gets it (dependencies inferred
        # from imports are on with a tool set), without declaring it.
        data, text, _ = await call(client, "execute_code", code="import numpy as np\nresult = float(np.mean([1, 2, 3]))", timeout=12)
        assert data["success"] is True and data["result"] == 2.0, text
    async with connect(snakebox_bin, data_dir, "auto", env=ibm) as client:
        report, _, _ = await call(client, "check_environment")
        assert report["timeouts"].startswith("default 30 s") and report["default_profile"] == "standard", report
    async with connect(snakebox_bin, data_dir, "auto", "--compat-tools", "--default-timeout", "20", "--profile", "basic", env=ibm) as client:
        report, _, _ = await call(client, "check_environment")
        assert report["timeouts"].startswith("default 20 s") and report["default_profile"] == "basic", report
