#!/usr/bin/env python3
"""What a front costs (issue 35): the same calls through one plain `snakebox serve --http` and
through a front (`serve --http --agents ...`) with three `snakebox agent`s (`--agents N`), in the same run, on
this one host (the hosts are simulated by loopback ports).

Sequential calls over MCP's stateless streamable HTTP (JSON answers), one client:
- hello: `print('hello')`, one-shot, p50/p99;
- a session cell: `x += 1` in one session, p50/p99;
- throughput: `--clients` clients in a loop for `--seconds`, one-shot hello, runs/s.

Every server runs with the warm pool and fork server at their defaults on its engine (a front's
own engine runs nothing). Reports the front's added cost per call (p50 difference).

    target/e2e-venv/bin/python bench/agents.py --snakebox target/release/snakebox
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx2 as httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "e2e"))
from http_support import http_server, make_key  # noqa: E402
from test_agents import agent_process, keypair  # noqa: E402


async def tool(http: httpx.AsyncClient, url: str, key: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {"name": name, "arguments": arguments}}
    response = await http.post(f"{url}/mcp", json=body,
                               headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"})
    response.raise_for_status()
    reply = response.json()
    result = reply["result"]
    if result.get("isError"):
        raise RuntimeError(str(result)[:300])
    return result["structuredContent"]


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


async def measure(url: str, key: str, calls: int, clients: int, seconds: float) -> dict[str, Any]:
    async with httpx.AsyncClient(timeout=120) as http:
        for _ in range(5):  # warm up: environments, pools, connections
            await tool(http, url, key, "execute_python", {"script": "print('hello')"})
        hello = []
        for _ in range(calls):
            started = time.perf_counter()
            run = await tool(http, url, key, "execute_python", {"script": "print('hello')"})
            hello.append((time.perf_counter() - started) * 1000)
            assert run["stdout"] == "hello\n", run
        session = await tool(http, url, key, "create_session", {})
        sid = session["session_id"]
        await tool(http, url, key, "execute_python", {"script": "x = 0", "session_id": sid})
        cells = []
        for _ in range(calls):
            started = time.perf_counter()
            await tool(http, url, key, "execute_python", {"script": "x += 1", "session_id": sid})
            cells.append((time.perf_counter() - started) * 1000)
        await tool(http, url, key, "delete_session", {"session_id": sid})
        done = [0]
        until = time.monotonic() + seconds

        async def loop() -> None:
            while time.monotonic() < until:
                await tool(http, url, key, "execute_python", {"script": "print('hello')"})
                done[0] += 1

        started = time.monotonic()
        await asyncio.gather(*(loop() for _ in range(clients)))
        elapsed = time.monotonic() - started
    return {"hello": percentiles(hello), "cell": percentiles(cells), "runs_per_s": done[0] / elapsed}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--agents", type=int, default=3,
                        help="agents behind the front (1 isolates the front's own cost: the same pool of sandboxes)")
    args = parser.parse_args()
    binary = args.snakebox.resolve()
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        data = root / "plain"
        key = make_key(binary, data, "bench")
        with http_server(binary, data) as (_, url):
            results["plain server"] = asyncio.run(measure(url, key, args.calls, args.clients, args.seconds))
        private, public = keypair(binary, root / "keys")
        front_data = root / "front"
        key = make_key(binary, front_data, "bench")
        with contextlib.ExitStack() as stack:
            agents = [stack.enter_context(agent_process(binary, root / f"agent{i}", public, pool=True))
                      for i in range(args.agents)]
            urls = ",".join(url for _, url in agents)
            with http_server(binary, front_data, "--agents", urls, "--front-key", str(private)) as (_, url):
                results[f"front + {args.agents} agent(s)"] = asyncio.run(measure(url, key, args.calls, args.clients, args.seconds))
    print(f"binary: {binary}; {args.calls} sequential calls each; {args.clients} clients for {args.seconds:.0f} s")
    print(f"{'':18} {'hello p50':>10} {'hello p99':>10} {'cell p50':>9} {'cell p99':>9} {'runs/s':>7}")
    for name, r in results.items():
        print(f"{name:18} {r['hello'][0]:8.1f}ms {r['hello'][1]:8.1f}ms {r['cell'][0]:7.1f}ms {r['cell'][1]:7.1f}ms {r['runs_per_s']:7.1f}")
    added = results[f"front + {args.agents} agent(s)"]["hello"][0] - results["plain server"]["hello"][0]
    print(f"the front's added cost, hello p50: {added:+.1f} ms (target: <= 1 ms)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
