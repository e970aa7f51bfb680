"""The import policy (issue 18): `allowed_imports` on `validate_script` and `execute_python`,
judged from outside.

- `validate_script` lists every import with its line and origin (stdlib, declared dependency,
  undeclared), flags those outside `allowed_imports` with their line, counts the script's
  functions and classes, and recommends declaring what is missing;
- `execute_python` refuses a script whose import statements leave the policy before anything
  runs (its line in the message, an `import_blocked` event), stops a dynamic import that the
  static check cannot see (ImportError, event with its line) on every launch path, and lets
  libraries import what they need;
- a bad module name and a session call are refused with a hint.
"""

from __future__ import annotations

import pytest

from conftest import call, connect, have_bwrap

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

SCRIPT = """import os.path
import numpy as np
from PIL import Image
import requests
m = __import__("json")
def f():
    import importlib
    return importlib.import_module("csv")
class K:
    pass
"""

DYNAMIC = """import fractions
print(fractions.Fraction(1, 3))
name = "sock" + "et"
__import__(name)
print("not reached")
"""


async def test_validate_lists_imports_and_flags_those_outside_the_policy(snakebox_bin, data_dir, mode):
    async with connect(snakebox_bin, data_dir, mode) as client:
        data, text, is_error = await call(client, "validate_script", script=SCRIPT, dependencies=["numpy", "pillow"],
                                          allowed_imports=["os", "numpy", "PIL", "importlib", "csv"])
    assert not is_error
    found = {(i["module"], i["line"]): (i["origin"], i["allowed"]) for i in data["imports"]}
    assert found == {
        ("os.path", 1): ("stdlib", True), ("numpy", 2): ("dependency", True), ("PIL", 3): ("dependency", True),
        ("requests", 4): ("undeclared", False), ("json", 5): ("stdlib", False),
        ("importlib", 7): ("stdlib", True), ("csv", 8): ("stdlib", True),
    }, data["imports"]
    assert data["valid"] is False
    flagged = sorted((p["line"], p["kind"]) for p in data["problems"])
    assert flagged == [(4, "import_not_allowed"), (5, "import_not_allowed")], data["problems"]
    assert data["analysis"] == {"lines": 10, "functions": 1, "classes": 1, "imports": 7}
    assert any("Line 4: `requests`" in r and "dependencies" in r for r in data["recommendations"]), data["recommendations"]
    assert "import requests (line 4, undeclared, not allowed)" in text
    # Without a policy nothing is flagged, and the undeclared import is still recommended.
    async with connect(snakebox_bin, data_dir, mode) as client:
        data, _, _ = await call(client, "validate_script", script=SCRIPT, dependencies=["numpy", "pillow"])
    assert data["valid"] is True and all(i["allowed"] for i in data["imports"])
    assert len(data["recommendations"]) == 1


async def test_execute_refuses_static_imports_and_stops_dynamic_ones(snakebox_bin, data_dir, mode):
    async with connect(snakebox_bin, data_dir, mode) as client:
        refused, text, _ = await call(client, "execute_python", script="import math\nimport subprocess\nprint(1)",
                                      allowed_imports=["math"])
        assert refused["status"] == "invalid_request", refused
        assert "`subprocess` (line 2)" in refused["error"]["message"] and refused["stdout"] == ""
        assert refused["events"] == [{"kind": "import_blocked",
                                      "detail": "import of `subprocess` (line 2) is outside the import policy"}]
        # The dynamic import the parser cannot see is stopped while the script runs, on every
        # launch path the server uses (cold, pre-started, forked): the same answer each time.
        for _ in range(4):
            data, _, _ = await call(client, "execute_python", script=DYNAMIC, allowed_imports=["fractions"])
            assert data["status"] == "error", data
            assert data["stdout"] == "1/3\n", data  # fractions' own imports (decimal, ...) were allowed
            assert data["exception"]["type_name"] == "ImportError" and data["exception"]["line"] == 4, data
            assert "outside the import policy" in data["exception"]["message"]
            assert [e["kind"] for e in data["events"]] == ["import_blocked"], data["events"]
            assert "(line 4)" in data["events"][0]["detail"]
        # Within the policy, the script runs as usual; without one, nothing is guarded.
        data, _, _ = await call(client, "execute_python", script="import os.path\nprint(os.path.join('a', 'b'))",
                                allowed_imports=["os"])
        assert data["status"] == "ok" and data["stdout"] == "a/b\n" and data["events"] == [], data
        data, _, _ = await call(client, "execute_python", script=DYNAMIC)
        assert data["status"] == "ok" and data["stdout"].endswith("not reached\n"), data


async def test_bad_names_and_sessions_are_refused_with_a_hint(snakebox_bin, data_dir, mode):
    async with connect(snakebox_bin, data_dir, mode) as client:
        data, _, _ = await call(client, "execute_python", script="print(1)", allowed_imports=["1bad"])
        assert data["status"] == "invalid_request" and "not a module name" in data["error"]["message"]
        assert "os.path" in data["error"]["hint"]
        session, _, _ = await call(client, "create_session")
        data, _, _ = await call(client, "execute_python", script="print(1)", session_id=session["session_id"],
                                allowed_imports=["math"])
        assert data["status"] == "invalid_request" and "one-shot" in data["error"]["hint"], data
        await call(client, "delete_session", session_id=session["session_id"])
