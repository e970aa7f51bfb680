#!/usr/bin/env python3
"""Load test of the HTTP face (issue 14): many concurrent clients over several tenants.

One `snakebox serve --http` with an API key per tenant. Clients post `tools/call
execute_python` to `/mcp` (stateless streamable HTTP, JSON answers) in a loop for the
duration; one tenant is a burst (half the clients), the others share the rest. Each run prints
when it started and ended inside its sandbox, so the per-tenant bound on runs at once is
judged from the runs themselves, not from the server's word.

It reports, and fails (exit 1) when one does not hold:
- every call answered: no transport error, no timeout, every result `ok` (or, in the quota
  phase, a `quota` refusal with a hint);
- runs of one tenant at once never above `--tenant-max-concurrent-runs`;
- no tenant starved: each small tenant completes at least `--min-share` of an equal share of
  the runs (the burst tenant wants far more than its share);
- runs per minute: with `--tenant-runs-per-minute`, a short second phase where one tenant
  goes over it and gets `quota` refusals with a wait, while another tenant is still served.
Then p50/p95 per tenant, runs/s, and, in the same run, the runs/s of the same binary over
stdio with as many calls in flight.

    target/e2e-venv/bin/python bench/http_load.py --snakebox target/release/snakebox
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2 as httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "e2e"))
from http_support import http_server, make_key  # noqa: E402

SCRIPT = "import time\nstart = time.time()\nprint('hi')\nprint(start, time.time())"


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


@dataclass
class Tenant:
    name: str
    key: str
    clients: int
    latencies_ms: list[float] = field(default_factory=list)
    intervals: list[tuple[float, float]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    quota_refusals: int = 0
    quota_hints: set[str] = field(default_factory=set)

    def max_overlap(self) -> int:
        events = sorted([(s, 1) for s, _ in self.intervals] + [(e, -1) for _, e in self.intervals], key=lambda x: (x[0], x[1]))
        now = best = 0
        for _, step in events:
            now += step
            best = max(best, now)
        return best


async def call(http: httpx.AsyncClient, url: str, key: str, n: int) -> dict[str, Any]:
    body = {"jsonrpc": "2.0", "id": n, "method": "tools/call", "params": {"name": "execute_python", "arguments": {"script": SCRIPT}}}
    response = await http.post(
        f"{url}/mcp", json=body,
        headers={"Authorization": f"Bearer {key}", "Accept": "application/json, text/event-stream"},
    )
    response.raise_for_status()
    reply = response.json()
    if "result" not in reply:
        raise RuntimeError(f"JSON-RPC error: {reply.get('error')}")
    return reply["result"]["structuredContent"]


async def client_loop(http: httpx.AsyncClient, url: str, tenant: Tenant, until: float, counter: list[int]) -> None:
    while time.monotonic() < until:
        counter[0] += 1
        started = time.perf_counter()
        try:
            result = await call(http, url, tenant.key, counter[0])
        except Exception as err:  # noqa: BLE001 - every failure is reported, none is fatal here
            tenant.failures.append(repr(err)[:300])
            continue
        elapsed = (time.perf_counter() - started) * 1000
        if result.get("status") == "ok":
            lines = result["stdout"].splitlines()
            begin, end = (float(x) for x in lines[1].split())
            tenant.intervals.append((begin, end))
            tenant.latencies_ms.append(elapsed)
        elif (result.get("error") or {}).get("kind") == "quota":
            tenant.quota_refusals += 1
            tenant.quota_hints.add((result["error"].get("hint") or "")[:120])
            await asyncio.sleep(0.2)
        else:
            tenant.failures.append(json.dumps({k: result.get(k) for k in ("status", "error", "stderr")})[:300])


async def load(url: str, tenants: list[Tenant], seconds: float) -> float:
    limits = httpx.Limits(max_connections=sum(t.clients for t in tenants) + 4)
    async with httpx.AsyncClient(timeout=120, limits=limits) as http:
        until = time.monotonic() + seconds
        counter = [0]
        started = time.monotonic()
        await asyncio.gather(*(client_loop(http, url, t, until, counter) for t in tenants for _ in range(t.clients)))
        return time.monotonic() - started


async def stdio_rate(binary: Path, data: Path, in_flight: int, seconds: float) -> float:
    """Runs/s of the same binary over stdio, `in_flight` calls at a time, one client."""
    proc = await asyncio.create_subprocess_exec(
        str(binary), "serve", "--data-dir", str(data),
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, limit=64 << 20,
    )
    assert proc.stdin is not None and proc.stdout is not None
    pending: dict[int, asyncio.Future[dict[str, Any]]] = {}

    async def reader() -> None:
        assert proc.stdout is not None
        while line := await proc.stdout.readline():
            message = json.loads(line)
            future = pending.pop(message.get("id"), None)
            if future is not None:
                future.set_result(message)

    reading = asyncio.create_task(reader())
    next_id = [0]

    async def request(method: str, params: dict[str, Any]) -> dict[str, Any]:
        next_id[0] += 1
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        pending[next_id[0]] = future
        assert proc.stdin is not None
        proc.stdin.write((json.dumps({"jsonrpc": "2.0", "id": next_id[0], "method": method, "params": params}) + "\n").encode())
        return await asyncio.wait_for(future, 120)

    await request("initialize", {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "load", "version": "0"}})
    proc.stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    done = [0]

    async def worker(until: float) -> None:
        while time.monotonic() < until:
            reply = await request("tools/call", {"name": "execute_python", "arguments": {"script": SCRIPT}})
            if reply["result"]["structuredContent"]["status"] != "ok":
                raise RuntimeError(f"stdio run failed: {reply}")
            done[0] += 1

    for _ in range(3):  # warm
        await request("tools/call", {"name": "execute_python", "arguments": {"script": SCRIPT}})
    started = time.monotonic()
    await asyncio.gather(*(worker(started + seconds) for _ in range(in_flight)))
    rate = done[0] / (time.monotonic() - started)
    proc.stdin.close()
    reading.cancel()
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(proc.wait(), 30)
    return rate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", default=str(REPO / "target" / "release" / "snakebox"))
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--tenants", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=60)
    parser.add_argument("--tenant-max-concurrent-runs", type=int, default=3)
    parser.add_argument("--tenant-runs-per-minute", type=int, default=60, help="checked in a short second phase; 0 skips it")
    parser.add_argument("--min-share", type=float, default=0.5, help="a small tenant's runs, as a fraction of an equal share, below which it counts as starved")
    args = parser.parse_args()
    binary = Path(args.snakebox)
    work = Path(tempfile.mkdtemp(prefix="snakebox-load-"))
    burst = args.clients // 2
    small = max(1, (args.clients - burst) // (args.tenants - 1))
    tenants: list[Tenant] = []
    data = work / "data"
    for i in range(args.tenants):
        name = "burst" if i == 0 else f"tenant-{i}"
        tenants.append(Tenant(name, make_key(binary, data, name), burst if i == 0 else small))
    problems: list[str] = []
    with http_server(binary, data, "--tenant-max-concurrent-runs", str(args.tenant_max_concurrent_runs)) as (proc, url):
        for tenant in tenants:  # warm: each tenant's first call
            asyncio.run(load(url, [Tenant(tenant.name, tenant.key, 1)], 0.01))
        elapsed = asyncio.run(load(url, tenants, args.seconds))
        alive = proc.poll() is None
    total = sum(len(t.latencies_ms) for t in tenants)
    rate = total / elapsed
    stdio = asyncio.run(stdio_rate(binary, work / "stdio-data", sum(t.clients for t in tenants), min(args.seconds, 20)))

    print(f"\n{sum(t.clients for t in tenants)} clients, {len(tenants)} tenants, {elapsed:.0f} s, "
          f"--tenant-max-concurrent-runs {args.tenant_max_concurrent_runs}, load {os.getloadavg()[0]:.1f}")
    print("| tenant | clients | runs | runs/s | p50 ms | p95 ms | max runs at once | failures |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for t in tenants:
        print(f"| {t.name} | {t.clients} | {len(t.latencies_ms)} | {len(t.latencies_ms) / elapsed:.1f} | "
              f"{percentile(t.latencies_ms, 0.5):.0f} | {percentile(t.latencies_ms, 0.95):.0f} | {t.max_overlap()} | {len(t.failures)} |")
    every = [x for t in tenants for x in t.latencies_ms]
    print(f"| all | {sum(t.clients for t in tenants)} | {total} | {rate:.1f} | {percentile(every, 0.5):.0f} | {percentile(every, 0.95):.0f} | | |")
    print(f"\nstdio, same binary, {sum(t.clients for t in tenants)} calls in flight: {stdio:.1f} runs/s "
          f"(HTTP/stdio = {rate / stdio:.2f})")

    if not alive:
        problems.append("the server died")
    equal = total / len(tenants)
    for t in tenants:
        if t.failures:
            problems.append(f"{t.name}: {len(t.failures)} calls failed, e.g. {t.failures[0]}")
        if t.max_overlap() > args.tenant_max_concurrent_runs:
            problems.append(f"{t.name}: {t.max_overlap()} runs at once, over the quota of {args.tenant_max_concurrent_runs}")
        if t is not tenants[0] and len(t.latencies_ms) < args.min_share * equal:
            problems.append(f"{t.name}: starved ({len(t.latencies_ms)} runs, an equal share is {equal:.0f})")

    if args.tenant_runs_per_minute:
        data2 = work / "data-rpm"
        greedy = Tenant("greedy", make_key(binary, data2, "greedy"), 4)
        polite = Tenant("polite", make_key(binary, data2, "polite"), 1)
        with http_server(binary, data2, "--tenant-runs-per-minute", str(args.tenant_runs_per_minute)) as (proc, url):
            asyncio.run(load(url, [greedy, polite], 10))
        served = len(greedy.latencies_ms)
        print(f"\nruns per minute {args.tenant_runs_per_minute}, 10 s: greedy served {served}, refused {greedy.quota_refusals} "
              f"(hint: {sorted(greedy.quota_hints)[:1]}); polite served {len(polite.latencies_ms)}, refused {polite.quota_refusals}")
        if served > args.tenant_runs_per_minute:
            problems.append(f"greedy: {served} runs in 10 s, over {args.tenant_runs_per_minute} per minute")
        if greedy.quota_refusals == 0 or not any(greedy.quota_hints):
            problems.append("greedy: no quota refusal with a hint")
        if not polite.latencies_ms or greedy.failures or polite.failures:
            problems.append(f"polite/greedy failures: {polite.failures[:1] + greedy.failures[:1]}")

    for problem in problems:
        print(f"FAILED: {problem}")
    print("all checks held" if not problems else f"{len(problems)} checks failed")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
