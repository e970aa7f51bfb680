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

`--directory-sessions N` measures the `kubernetes` directory instead, against the SIMULATED API
server of tests/e2e/kube_sim.py and one agent: a session cell p50 with the front's cache holding
no other claim and then N more (another tenant's, delivered by its watch), an unknown session
id's lookup (not in the cache: a list by its label, then `not_found`), and how long a restarted
front takes to be ready with N + 1 claims to list.
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
from kube_sim import KubeSim, now  # noqa: E402
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


def preload(sim: KubeSim, count: int, ip: str, port: int) -> None:
    """`count` bound session claims of another tenant, all Ready at `ip`, as the watch sees them."""
    with sim.cond:
        for n in range(count):
            name = f"sbx-bench-{n:05d}"
            obj = {"apiVersion": "extensions.agents.x-k8s.io/v1beta1", "kind": "SandboxClaim",
                   "metadata": {"name": name, "namespace": sim.namespace, "uid": name, "generation": 1,
                                "creationTimestamp": now(), "resourceVersion": sim._bump(),
                                "labels": {"app.kubernetes.io/managed-by": "snakebox", "snakebox.dev/kind": "session",
                                           "snakebox.dev/tenant": "t-other-000000000000",
                                           "snakebox.dev/session": f"s-bench-{n}"},
                                "annotations": {"snakebox.dev/tenant": "other", "snakebox.dev/session-id": f"s-bench-{n}",
                                                "snakebox.dev/agent": f"{ip}:{port}"}},
                   "spec": {"warmPoolRef": {"name": "pool"}},
                   "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "Ready", "message": "",
                                              "lastTransitionTime": now()}],
                              "sandbox": {"name": name, "podIPs": [ip]}}}
            sim.claims[name] = obj
            sim._event("ADDED", obj)


async def cells(url: str, key: str, sid: str, calls: int) -> float:
    async with httpx.AsyncClient(timeout=120) as http:
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            await tool(http, url, key, "execute_python", {"script": "x += 1", "session_id": sid})
            samples.append((time.perf_counter() - started) * 1000)
    return percentiles(samples)[0]


async def unknown(url: str, key: str, calls: int) -> float:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/call",
            "params": {"name": "execute_python", "arguments": {"script": "1", "session_id": "s-0000"}}}
    async with httpx.AsyncClient(timeout=120) as http:
        samples = []
        for _ in range(calls):
            started = time.perf_counter()
            reply = (await http.post(f"{url}/mcp", json=body, headers={
                "Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"})).json()
            samples.append((time.perf_counter() - started) * 1000)
            assert reply["result"]["isError"], reply
    return percentiles(samples)[0]


def directory_bench(binary: Path, sessions: int, calls: int) -> int:
    host = "127.0.0.2"
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        private, public = keypair(binary, root / "keys")
        front_data = root / "front"
        key = make_key(binary, front_data, "bench")
        sim = KubeSim("bench", [host]).start()
        try:
            with agent_process(binary, root / "agent", public, pool=True, host=host) as (_, agent_url):
                port = int(agent_url.rsplit(":", 1)[1])
                args = ("--directory", "kubernetes", "--front-key", str(private), "--agent-port", str(port))
                env = {"KUBECONFIG": str(sim.kubeconfig(root / "kubeconfig")), "HOME": str(root)}

                async def session() -> str:
                    async with httpx.AsyncClient(timeout=120) as http:
                        sid = (await tool(http, url, key, "create_session", {}))["session_id"]
                        await tool(http, url, key, "execute_python", {"script": "x = 0", "session_id": sid})
                        return sid

                with http_server(binary, front_data, *args, env=env) as (_, url):
                    sid = asyncio.run(session())
                    alone = asyncio.run(cells(url, key, sid, calls))
                    preload(sim, sessions, host, port)
                    time.sleep(1.0)  # the watch delivers them
                    crowded = asyncio.run(cells(url, key, sid, calls))
                    lookup = asyncio.run(unknown(url, key, calls))
                started = time.monotonic()
                with http_server(binary, front_data, *args, env=env) as (_, url):
                    while True:
                        with contextlib.suppress(Exception):
                            if httpx.get(f"{url}/readyz", timeout=5).status_code == 200:
                                break
                        time.sleep(0.02)
                    ready = time.monotonic() - started
                    restarted = asyncio.run(cells(url, key, sid, calls))
        finally:
            sim.stop()
    print(f"binary: {binary}; kubernetes directory against the SIMULATED API server; {calls} calls each")
    print(f"session cell p50, the cache holding 1 claim: {alone:.1f} ms; {sessions + 1} claims: {crowded:.1f} ms "
          f"({crowded - alone:+.1f} ms); after a restart: {restarted:.1f} ms")
    print(f"an unknown session id (a list by label, then not_found) p50: {lookup:.1f} ms")
    print(f"a restarted front ready (process start + list of {sessions + 1} claims + watch): {ready * 1000:.0f} ms")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", type=Path, required=True)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--agents", type=int, default=3,
                        help="agents behind the front (1 isolates the front's own cost: the same pool of sandboxes)")
    parser.add_argument("--directory-sessions", type=int, default=0,
                        help="measure the kubernetes directory (simulated API server) with this many claims instead")
    args = parser.parse_args()
    binary = args.snakebox.resolve()
    if args.directory_sessions:
        return directory_bench(binary, args.directory_sessions, args.calls)
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
