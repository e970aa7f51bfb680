#!/usr/bin/env python3
"""Where the time of one warm `print('hi')` call goes, from kernel tracepoints.

Starts `snakebox serve` (own fresh --data-dir), warms it, then records scheduler and syscall
tracepoints system-wide with `perf record -k CLOCK_MONOTONIC` (no ptrace: the traced processes
run at full speed) while a raw JSON-RPC client makes N spaced calls. The client's send/receive
times are CLOCK_MONOTONIC too, so each call is cut into phases at these kernel events:

  send → server forks the bwrap child → child's first syscall after setsid + cgroup join
  (unshare of the staging namespace) → exec bwrap → exec python inside → python exits →
  bwrap exits → server reaps it → server's last rmdir/unlink (cgroup + run dir removed) → reply.

With the fork server on (the default), a call is forked instead: `--path forked` (chosen by
itself when no bwrap child is seen) cuts it at the fork server's events instead:

  send → the server sends the request to the run's pid 2 → pid 2 has it (when no pre-forked
  child was ready: the fork server clones pid 1, pid 1's unshare, pid 1 forks pid 2) → pid 2
  says its exit code (a queued signal) → pid 1 reports the end → pid 2 and pid 1 exit (in the
  order they do) → the server's last rmdir/unlink → reply received,

and adds where the CPU of each call goes (`sched:sched_stat_runtime`, by process role and
server thread), on the hot path (send → reply) and after the reply (until the next call), and,
where the kernel has the `exceptions:page_fault_user` tracepoint, the page faults of each
call by process role: copy-on-write (a write to a page shared with the fork server) or other
(a first touch, a page of a file mapped again), from the call's send until the next call.

Needs root and `perf` with tracefs. Usage:

    target/e2e-venv/bin/python bench/profile_call.py [-n 20] [--snakebox PATH] [--path cold|forked]
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
    "syscalls:sys_enter_sendmsg",
    "syscalls:sys_exit_recvmsg",
    "syscalls:sys_enter_sendto",
    "syscalls:sys_enter_write",
    "syscalls:sys_enter_rt_sigqueueinfo",
    "sched:sched_stat_runtime",
]
# Recorded too where this kernel has it (x86): each user-space page fault, with its error code.
FAULT_EVENT = "exceptions:page_fault_user"


def have_tracepoint(name: str) -> bool:
    group, event = name.split(":")
    return any(Path(root, "events", group, event).is_dir() for root in ("/sys/kernel/tracing", "/sys/kernel/debug/tracing"))

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


def fork_processes() -> dict[int, int]:
    """pid → parent pid of every process running the fork server's program (fork servers and
    their pre-forked children)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            # (bwrap's own command line names the program too.)
            if b"forkserver.py" not in (entry / "cmdline").read_bytes() or (entry / "comm").read_text().strip() == "bwrap":
                continue
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        found[int(entry.name)] = int(stat.rsplit(")", 1)[1].split()[1])
    return found


async def drive(
    binary: Path, data: Path, version: str, n: int, gap: float, perf_out: Path, extra: list[str]
) -> tuple[int, list[tuple[float, float]], dict[int, int]]:
    env = {"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()), **passed_through()}
    argv = [str(binary), "serve", "--data-dir", str(data), "--python-version", version, *extra]
    async with RawClient(argv, env) as client:
        for _ in range(5):
            result = await client.execute("print('hi')")
            assert result["status"] == "ok", result
        # The fork server has started by now (or will not): let it settle, then note its tree.
        await asyncio.sleep(2)
        for _ in range(3):
            result = await client.execute("print('hi')")
            assert result["status"] == "ok", result
        await asyncio.sleep(0.5)
        tree = fork_processes()
        events = EVENTS + ([FAULT_EVENT] if have_tracepoint(FAULT_EVENT) else [])
        perf = subprocess.Popen(
            ["perf", "record", "-q", "-k", "CLOCK_MONOTONIC", "-a", "-o", str(perf_out), *sum((["-e", e] for e in events), [])],
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
        return client.proc.pid, calls, tree


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


def tgid_of(events: list) -> dict[int, int]:
    """tid → tgid, from every event's pid/tid pair."""
    return {e[3]: e[2] for e in events}


def forked_phases(
    server: int, calls: list[tuple[float, float]], events: list, tree: dict[int, int]
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, list[float]], dict[str, list[float]]]:
    """Phases of forked calls, the CPU of each (hot path, and after the reply until the next
    call) by process role, and the page faults of each (until the next call) by role and kind."""
    parent = dict(tree)
    for e in events:
        if e[4] == "sched_process_fork":
            m = re.search(r"child_pid=(\d+)", e[5])
            if m:
                parent[int(m.group(1))] = e[2]
    servers = {pid for pid, ppid in tree.items() if ppid not in tree}

    def depth(pid: int) -> int | None:
        """How far below a fork server `pid` is (0: a fork server)."""
        d = 0
        while pid not in servers:
            if pid not in parent or d > 6:
                return None
            pid = parent[pid]
            d += 1
        return d

    tgid = tgid_of(events)
    names = {1: "pid 1 (init: makes the sandbox, reports the end)", 2: "pid 2 (attaches its run, runner + script)"}

    def role(pid: int, tid: int, comm: str) -> str | None:
        if pid == server:
            return f"server thread `{comm}`"
        d = depth(pid)
        if d == 0:
            return "fork server"
        if d is not None:
            return "run: " + names.get(d, "the script's own children")
        return None

    phases: dict[str, list[float]] = {}
    hot: dict[str, list[float]] = {}
    after: dict[str, list[float]] = {}
    faults: dict[str, list[float]] = {}
    for index, (t0, t1) in enumerate(calls):
        end = calls[index + 1][0] if index + 1 < len(calls) else t1 + 0.2
        w = [e for e in events if t0 <= e[0] <= t1 + 0.005]
        # The request handed over by the server, and the run's process (pid 2) that takes it.
        handed = next((e for e in w if e[4] == "sys_enter_sendmsg" and e[2] == server), None)
        taken = None
        if handed is not None:
            taken = next((e for e in w if e[4] == "sys_exit_recvmsg" and e[0] >= handed[0] and depth(e[2]) == 2), None)
        if taken is None:
            print(f"call at {t0:.3f}: no forked run seen, skipped", file=sys.stderr)
            continue
        pid2 = taken[2]
        pid1 = parent[pid2]
        points: list[tuple[str, float]] = [("client send", t0), ("server sends the request", handed[0]), ("pid 2 has the request", taken[0])]
        # A child made for this run (none ready): its clone, namespaces and pid 2's fork.
        pid1_clone = next((e for e in w if e[4] == "sched_process_fork" and f"child_pid={pid1} " in e[5] + " "), None)
        if pid1_clone is not None:
            points.append(("the fork server clones pid 1", pid1_clone[0]))
            unshare = next((e for e in w if e[4] == "sys_enter_unshare" and e[2] == pid1), None)
            if unshare is not None:
                points.append(("pid 1's unshare", unshare[0]))
            pid2_fork = next((e for e in w if e[4] == "sched_process_fork" and f"child_pid={pid2} " in e[5] + " "), None)
            if pid2_fork is not None:
                points.append(("pid 1 forks pid 2", pid2_fork[0]))
        exits = {e[2]: e[0] for e in w if e[4] == "sched_process_exit" and e[2] == e[3]}
        # Pid 2 says its exit code as its runner ends (a queued signal to pid 1), and the end
        # reported to the server: pid 1's one write on its socket, on that signal (while pid 2
        # exits) or once pid 2 is reaped.
        said = next((e for e in w if e[4] == "sys_enter_rt_sigqueueinfo" and e[2] == pid2), None)
        if said is not None:
            points.append(("pid 2 says its exit code", said[0]))
        report = next((e for e in w if e[4] == "sys_enter_write" and e[2] == pid1 and e[0] >= taken[0]), None)
        if report is not None:
            points.append(("pid 1 reports the end", report[0]))
        for label, pid in (("pid 2 exits", pid2), ("pid 1 exits", pid1)):
            if pid in exits:
                points.append((label, exits[pid]))
        last = max(p[1] for p in points)
        removal = [e for e in w if e[2] == server and e[4] in ("sys_enter_rmdir", "sys_enter_unlinkat") and e[0] > last and e[0] <= t1]
        if removal:
            points.append(("server's last rmdir/unlink before the reply", removal[-1][0]))
        points.append(("response received", t1))
        points.sort(key=lambda p: p[1])
        for (a, ta), (b, tb) in zip(points, points[1:]):
            phases.setdefault(f"{a} → {b}", []).append((tb - ta) * 1000)
        phases.setdefault("total, client send → response", []).append((t1 - t0) * 1000)
        for bucket, lo, hi in ((hot, t0, t1), (after, t1, end)):
            spent: dict[str, float] = {}
            for e in events:
                if e[4] != "sched_stat_runtime" or not lo <= e[0] <= hi:
                    continue
                m = re.search(r"runtime=(\d+)", e[5])
                who = role(tgid.get(e[3], e[2]), e[3], e[1])
                if m and who is not None:
                    spent[who] = spent.get(who, 0.0) + int(m.group(1)) / 1e6
            for who, ms in spent.items():
                bucket.setdefault(who, []).append(ms)
        counted: dict[str, float] = {}
        for e in events:
            if e[4] != "page_fault_user" or not t0 <= e[0] < end:
                continue
            m = re.search(r"error_code=0x([0-9a-f]+)", e[5])
            who = role(tgid.get(e[3], e[2]), e[3], e[1])
            if m is None or who is None:
                continue
            # Bit 0: the page was present (a protection fault), bit 1: a write.
            kind = "copy-on-write" if int(m.group(1), 16) & 3 == 3 else "other"
            counted[f"{who}, {kind}"] = counted.get(f"{who}, {kind}", 0.0) + 1
        for key, count in counted.items():
            faults.setdefault(key, []).append(count)
    return phases, hot, after, faults


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--snakebox", default=str(REPO / "target" / "release" / "snakebox"))
    parser.add_argument("--python-version")
    parser.add_argument("-n", type=int, default=20, help="calls traced")
    parser.add_argument("--gap", type=float, default=0.3, help="seconds between calls (an idle server between calls)")
    parser.add_argument("--path", choices=["auto", "cold", "forked"], default="auto", help="which launch path to cut the calls by")
    parser.add_argument("--server-arg", action="append", default=[], help="an extra argument for `snakebox serve` (repeatable)")
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
        server, calls, tree = asyncio.run(drive(binary, data, version, args.n, args.gap, work / "perf.data", args.server_arg))
        events = parse(work / "perf.data")
        path = args.path
        if path == "auto":
            path = "forked" if tree else "cold"
        hot: dict[str, list[float]] = {}
        after: dict[str, list[float]] = {}
        faults: dict[str, list[float]] = {}
        if path == "forked":
            result, hot, after, faults = forked_phases(server, calls, events, tree)
        else:
            result = phases(server, calls, events)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(result.get("total, client send → response", []))
    print(f"{n} calls ({path}), load {' '.join(f'{x:.2f}' for x in os.getloadavg())}\n")
    print("| phase | median ms | min | max | n |\n|---|---:|---:|---:|---:|")
    for name, values in result.items():
        print(f"| {name} | {statistics.median(values):.2f} | {min(values):.2f} | {max(values):.2f} | {len(values)} |")
    for title, bucket in (("on the hot path (send → reply)", hot), ("after the reply, until the next call", after)):
        if not bucket:
            continue
        # Mean over all calls (a role that did not run in a call counts 0 there).
        print(f"\nCPU {title}, ms per call (mean)\n\n| who | ms |\n|---|---:|")
        total = 0.0
        for who, values in sorted(bucket.items(), key=lambda kv: -sum(kv[1])):
            mean = sum(values) / n if n else 0.0
            total += mean
            print(f"| {who} | {mean:.2f} |")
        print(f"| **all of it** | {total:.2f} |")
    if faults:
        print("\nPage faults per call (mean), from its send until the next call\n\n| who, kind | faults |\n|---|---:|")
        for key, values in sorted(faults.items()):
            print(f"| {key} | {sum(values) / n if n else 0.0:.0f} |")
    print(json.dumps({k: statistics.median(v) for k, v in result.items()}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
