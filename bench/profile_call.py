#!/usr/bin/env python3
"""Where the time of one warm `print('hi')` call goes, from kernel tracepoints.

Starts `snakebox serve` (own fresh --data-dir), warms it, then records scheduler and syscall
tracepoints system-wide with `perf record -k CLOCK_MONOTONIC` (no ptrace: the traced processes
run at full speed) while a raw JSON-RPC client makes N spaced calls. The client's send/receive
times are CLOCK_MONOTONIC too, so each call is cut into phases at these kernel events:

  send → server forks the bwrap child → child's first syscall after setsid + cgroup join
  (unshare of the staging namespace) → exec bwrap → exec python inside → python exits →
  bwrap exits → server reaps it → server's last rmdir/unlink (cgroup + run dir removed) → reply.

Needs root and `perf` with tracefs. Usage:

    target/e2e-venv/bin/python bench/profile_call.py [-n 20] [--snakebox PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, RawClient, passed_through, real_python  # noqa: E402

EVENTS = [
    "sched:sched_process_fork",
    "sched:sched_process_exec",
    "sched:sched_process_exit",
    "syscalls:sys_enter_unshare",
    "syscalls:sys_enter_rmdir",
    "syscalls:sys_enter_unlinkat",
    "syscalls:sys_exit_wait4",
]

PHASES = [
    "MCP + engine before spawn (parse, env lookup, run dir, cgroup mkdir, argv)",
    "fork → child ready (setsid, cgroup join, rlimits)",
    "staging mounts + exec bwrap",
    "bwrap: namespaces, mounts, seccomp → exec python",
    "python: exec → exit",
    "python exit → bwrap exit",
    "bwrap exit → server reaps it",
    "teardown (kill sweep, cgroup rmdir, run dir removal)",
    "result → response received by the client",
]


async def drive(binary: Path, data: Path, version: str, n: int, gap: float, perf_out: Path) -> tuple[int, list[tuple[float, float]]]:
    env = {"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()), **passed_through()}
    argv = [str(binary), "serve", "--data-dir", str(data), "--python-version", version]
    async with RawClient(argv, env) as client:
        for _ in range(5):
            result = await client.execute("print('hi')")
            assert result["status"] == "ok", result
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-a", "-o", str(perf_out), *sum((["-e", e] for e in EVENTS), [])],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        await asyncio.sleep(1.5)
        calls = []
        try:
            for _ in range(n):
                t0 = time.monotonic()
                result = await client.execute("print('hi')")
                t1 = time.monotonic()
                assert result["stdout"] == "hi\n", result
                calls.append((t0, t1))
                await asyncio.sleep(gap)
        finally:
            perf.send_signal(signal.SIGINT)
            perf.wait()
        return client.proc.pid, calls


def parse(perf_out: Path) -> list[tuple[float, str, int, int, str, str]]:
    text = subprocess.run(
        ["perf", "script", "-i", str(perf_out), "-F", "comm,pid,tid,time,event,trace"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    events = []
    for line in text.splitlines():
        m = re.match(r"\s*(\S.*?)\s+(\d+)/(\d+)\s+(\d+\.\d+):\s+(\S+):\s*(.*)", line)
        if m:
            comm, pid, tid, t, event, rest = m.groups()
            events.append((float(t), comm, int(pid), int(tid), event.split(":")[-1], rest))
    events.sort()
    return events


def phases(server: int, calls: list[tuple[float, float]], events: list) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for t0, t1 in calls:
        w = [e for e in events if t0 <= e[0] <= t1 + 0.005]
        try:
            fork = next(e for e in w if e[4] == "sched_process_fork" and e[2] == server)
            child = int(re.search(r"child_pid=(\d+)", fork[5]).group(1))  # type: ignore[union-attr]
            first = next(e for e in w if e[3] == child and e[0] > fork[0] and e[4] != "sched_process_fork")
            bwrap = next(e for e in w if e[4] == "sched_process_exec" and e[2] == child)
            python = next(e for e in w if e[4] == "sched_process_exec" and "bin/python" in e[5])
            py_exit = next(e for e in w if e[4] == "sched_process_exit" and e[2] == python[2])
            bwrap_exit = next(e for e in w if e[4] == "sched_process_exit" and e[2] == child)
            reaped = next(e for e in w if e[4] == "sys_exit_wait4" and e[2] == server and e[0] >= bwrap_exit[0])
        except StopIteration:
            print(f"call at {t0:.3f}: incomplete trace, skipped", file=sys.stderr)
            continue
        removal = [e for e in w if e[2] == server and e[4] in ("sys_enter_rmdir", "sys_enter_unlinkat") and e[0] > reaped[0]]
        teardown_end = removal[-1][0] if removal else reaped[0]
        points = [t0, fork[0], first[0], bwrap[0], python[0], py_exit[0], bwrap_exit[0], reaped[0], teardown_end, t1]
        for i, name in enumerate(PHASES):
            out.setdefault(name, []).append((points[i + 1] - points[i]) * 1000)
        out.setdefault("total, client send → response", []).append((t1 - t0) * 1000)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", default=str(REPO / "target" / "release" / "snakebox"))
    parser.add_argument("--python-version")
    parser.add_argument("-n", type=int, default=20, help="calls traced")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between calls (an idle server between calls)")
    args = parser.parse_args()
    if shutil.which("perf") is None:
        raise SystemExit("perf not found")
    _, version = real_python(args.python_version)
    work = Path(tempfile.mkdtemp(prefix="snakebox-profile-"))
    work.chmod(0o755)
    try:
        binary = work / "snakebox"
        shutil.copy2(args.snakebox, binary)
        data = work / "data"
        data.mkdir(mode=0o755)
        server, calls = asyncio.run(drive(binary, data, version, args.n, args.gap, work / "perf.data"))
        result = phases(server, calls, parse(work / "perf.data"))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(next(iter(result.values()), []))
    print(f"{n} calls, load {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| phase | median ms | min | max |\n|---|---:|---:|---:|")
    for name, values in result.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} |")
    print(json.dumps({k: statistics.median(v) for k, v in result.items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
