"""Tenants share nothing (issue 32), judged over HTTP with two or three tenants' keys against
the real binary. What one tenant does must not show in what another is told.

- Reports (item 3): `check_environment` shows a tenant the fork servers, kept-warm
  environments and failures of environments with packages only when they are its own: a fork
  server that ran a tenant's packages' import-time code names those packages (`preloaded`)
  and the environment's cache key, which another tenant must not learn. The counts stay the
  server's (server-wide totals are the only shared facts).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import anyio
import pytest

from conftest import call, have_bwrap
from http_support import http_server, make_key
from test_http import connect

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

SIX = "# /// script\n# dependencies = [\"six==1.16.0\"]\n# ///\nimport six\nprint(six.__version__)\n"


async def test_check_environment_shows_a_tenant_only_its_own_environments_and_fork_servers(snakebox_bin: Path, tmp_path: Path):
    data = tmp_path / "data"
    key_a = make_key(snakebox_bin, data, "team-a")
    key_b = make_key(snakebox_bin, data, "team-b")
    with http_server(snakebox_bin, data) as (proc, url):
        async with connect(url, key_a, "auto") as a:
            run, text, _ = await call(a, "execute_python", script=SIX, timeout_seconds=240)
            assert run["status"] == "ok" and run["stdout"] == "1.16.0\n", text
            # A's environment with packages gets a fork server of its own (the pool keeps the
            # recently used warm): wait until A's own report shows it preloading six.
            deadline = time.monotonic() + 120
            while True:
                report_a, _, _ = await call(a, "check_environment")
                pool_a = report_a["warm_pool"]
                mine = [f for f in pool_a["fork_server_details"] if "six" in f["preloaded"]]
                if mine:
                    break
                assert time.monotonic() < deadline, pool_a
                await anyio.sleep(0.5)
            key_of_a = mine[0]["environment"]
            assert key_of_a in " ".join(pool_a["environments"]), pool_a

        async with connect(url, key_b, "auto") as b:
            report_b, text, _ = await call(b, "check_environment")
        pool_b = report_b["warm_pool"]
        blob = json.dumps(report_b)
        # Proof the server is the same one and A's fork server is still running: the counts.
        assert pool_b["fork_servers"] == pool_a["fork_servers"] >= 1, (pool_a, pool_b)
        # Nothing of A's environment reaches B: not its key, not its packages.
        assert key_of_a not in blob, pool_b
        assert "six" not in blob, [f for f in pool_b["fork_server_details"]]
        assert all("six" not in f["preloaded"] for f in pool_b["fork_server_details"]), pool_b
        assert proc.poll() is None
