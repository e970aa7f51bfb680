"""The hostile soak: many mixed calls through one real server, several in flight at once,
each reply checked, and what the server holds on the host counted from outside before and
after (issue 12).

Used by `test_soak.py` (a short soak in CI) and by `scripts/soak` (the long one, for
releases). The mix: plain runs, errors, timeouts, memory bombs, fork bombs, output floods,
runs that leave files (read back through `resources/read`), session cells (a counter per
session: each cell must see the one before), invalid requests, unavailable interpreters, and
runs cancelled by the client mid-run. Runs that would leave processes behind if a kill
failed (timeouts, cancellations) start a child carrying the soak's marker.

After the calls, the sessions are deleted and the server is given time to settle (the warm
pool and fork servers refill); then its processes (by pid ancestry), cgroups, run
directories and mounts must be back to what they were after the warm-up, no marker process
may be left, and its open file descriptors must be flat. Nothing here is timed: durations
are reported, never asserted.
"""

from __future__ import annotations

import base64
import os
import random
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Callable

import anyio

from attacks_support import marker_pids
from host_support import Server, cgroups_of, descendants, fd_count, mounts_under, run_dirs_of

# The limits the soak's server runs with (the bombs meet them quickly).
FLAGS = ("--memory-limit", "128MiB", "--max-processes", "64", "--max-output-bytes", "65536")
OUTPUT_BUDGET = 65536
SESSIONS = 3


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


# ---------------------------------------------------------------------------------------------
# The kinds of call: what to send, and what the reply must say.
# ---------------------------------------------------------------------------------------------


@dataclass
class Job:
    kind: str
    index: int
    marker: str


class Failure(AssertionError):
    pass


def expect(condition: bool, what: str, reply: Any) -> None:
    if not condition:
        raise Failure(f"{what}: {str(reply)[:600]}")


LEAVE_A_CHILD = """
import subprocess, sys, time
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)", {marker!r}])
print("started", flush=True)
"""


async def run_ok(server: Server, job: Job) -> str:
    data = await server.call("execute_python", script=f"print({job.index})\n{job.index} * 2")
    expect(data["status"] == "ok" and data["stdout"] == f"{job.index}\n", "ok", data)
    expect(data["result"]["json"] == job.index * 2, "ok: the last expression's value", data)
    return data["status"]


async def run_error(server: Server, job: Job) -> str:
    data = await server.call("execute_python", script=f"print('before')\nraise ValueError('soak {job.index}')")
    expect(data["status"] == "error" and data["exit_code"] == 1, "error", data)
    expect(data["exception"]["type_name"] == "ValueError" and data["exception"]["message"] == f"soak {job.index}", "error: the exception", data)
    expect(data["stdout"] == "before\n", "error: the output before it", data)
    return data["status"]


async def run_timeout(server: Server, job: Job) -> str:
    script = LEAVE_A_CHILD.format(marker=job.marker) + "time.sleep(600)\n"
    data = await server.call("execute_python", script=script, timeout_seconds=1)
    expect(data["status"] == "timeout" and data["timed_out"] is True, "timeout", data)
    expect("started" in data["stdout"], "timeout: the output before it", data)
    return data["status"]


async def run_memory(server: Server, job: Job) -> str:
    data = await server.call("execute_python", script="print('allocating', flush=True)\nx = bytearray(512 << 20)\nprint(len(x))")
    # The cgroup's limit ends the run (memory_limit); where the allocator fails first, the
    # script dies of MemoryError (error). Never ok.
    memory_error = data["status"] == "error" and "MemoryError" in (data["exception"] or {}).get("type_name", "")
    expect(data["status"] == "memory_limit" or memory_error, "memory", data)
    expect("allocating" in data["stdout"], "memory: proof the script ran", data)
    return data["status"]


async def run_fork_bomb(server: Server, job: Job) -> str:
    script = "import os\nprint('bombing', flush=True)\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n"
    data = await server.call("execute_python", script=script, timeout_seconds=2)
    expect(data["status"] == "timeout" and "bombing" in data["stdout"], "fork bomb", data)
    return data["status"]


async def run_flood(server: Server, job: Job) -> str:
    script = "import sys\nfor _ in range(64):\n    sys.stdout.write('A' * 65536)\nprint('end')"
    data = await server.call("execute_python", script=script)
    expect(data["status"] == "ok" and data["stdout_truncated"] is True, "flood", data)
    expect(data["stdout"].endswith("end\n"), "flood: the tail is kept", data)
    expect(len(data["stdout"].encode()) + len(data["stderr"].encode()) <= OUTPUT_BUDGET + 1024, "flood: the cap", data)
    return data["status"]


async def run_files(server: Server, job: Job) -> str:
    script = "".join(f"open('{name}.txt', 'w').write('{name}-{job.index}')\n" for name in "abc")
    data = await server.call("execute_python", script=script)
    expect(data["status"] == "ok", "files", data)
    names = sorted(a["name"] for a in data["artifacts"])
    expect(names == ["a.txt", "b.txt", "c.txt"], "files: the artifacts", data)
    uri = next(a["uri"] for a in data["artifacts"] if a["name"] == "b.txt")
    content = (await server.client.read_resource(uri)).contents[0]
    text = getattr(content, "text", None)
    if text is None:
        text = base64.b64decode(content.blob).decode()
    expect(text == f"b-{job.index}", "files: read back", content)
    return data["status"]


async def run_invalid(server: Server, job: Job) -> str:
    data = await server.call("execute_python", script="print(1)", timeout_seconds=0)
    expect(data["status"] == "invalid_request" and data["error"]["hint"], "invalid", data)
    return data["status"]


async def run_no_interpreter(server: Server, job: Job) -> str:
    data = await server.call("execute_python", script="print(1)", python_version="2.7")
    expect(data["status"] == "setup_failed" and data["error"]["hint"], "no interpreter", data)
    return data["status"]


async def run_cancelled(server: Server, job: Job) -> str:
    """The client cancels mid-run (MCP `notifications/cancelled`): no reply is due; the run's
    processes must end, which the final marker count checks."""
    script = LEAVE_A_CHILD.format(marker=job.marker) + "time.sleep(600)\n"
    replies: list[Any] = []
    with anyio.CancelScope() as scope:

        async def send() -> None:
            replies.append(await server.client.call_tool("execute_python", {"script": script, "timeout_seconds": 120}))

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(send)
            deadline = time.monotonic() + 120
            while not marker_pids(job.marker):
                expect(time.monotonic() < deadline and not replies, "cancelled: the run did not start", replies)
                await anyio.sleep(0.1)
            scope.cancel()
    expect(not replies, "cancelled: the run ended before it was cancelled", replies)
    return "cancelled"


class SessionCells:
    """Cells of a few sessions; each session's cells are sent one after another, and each
    must see the counter the previous one left."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self.counts: list[int] = []
        self.locks: list[anyio.Lock] = []

    async def create(self, server: Server) -> None:
        for n in range(SESSIONS):
            created = await server.call("create_session", name=f"soak-{n}")
            self.ids.append(created["session_id"])
            self.counts.append(0)
            self.locks.append(anyio.Lock())

    async def run(self, server: Server, job: Job) -> str:
        n = job.index % len(self.ids)
        async with self.locks[n]:
            data = await server.call(
                "execute_python",
                script="counter = globals().get('counter', 0) + 1\ncounter",
                session_id=self.ids[n],
                timeout_seconds=60,
            )
            self.counts[n] += 1
            expect(data["status"] == "ok" and data["result"]["json"] == self.counts[n], f"session cell {self.counts[n]}", data)
        return data["status"]

    async def delete(self, server: Server) -> None:
        for session_id in self.ids:
            await server.call("delete_session", session_id=session_id)


# (name, weight in percent)
MIX: list[tuple[str, int]] = [
    ("ok", 30),
    ("error", 10),
    ("timeout", 6),
    ("memory_limit", 6),
    ("fork_bomb", 3),
    ("output_flood", 5),
    ("files", 12),
    ("session_cell", 15),
    ("cancelled", 6),
    ("invalid_request", 4),
    ("no_interpreter", 3),
]

RUNNERS: dict[str, Callable[..., Any]] = {
    "ok": run_ok,
    "error": run_error,
    "timeout": run_timeout,
    "memory_limit": run_memory,
    "fork_bomb": run_fork_bomb,
    "output_flood": run_flood,
    "files": run_files,
    "invalid_request": run_invalid,
    "no_interpreter": run_no_interpreter,
    "cancelled": run_cancelled,
}


def plan(runs: int, seed: int) -> list[str]:
    """`runs` kinds in the mix's proportions (every kind at least once), shuffled."""
    total = sum(w for _, w in MIX)
    kinds = [name for name, weight in MIX for _ in range(max(1, round(runs * weight / total)))]
    rng = random.Random(seed)
    while len(kinds) < runs:
        kinds.append("ok")
    kinds = kinds[:runs] if len(kinds) > runs else kinds
    rng.shuffle(kinds)
    return kinds


# ---------------------------------------------------------------------------------------------
# What the server holds, before and after.
# ---------------------------------------------------------------------------------------------


@dataclass
class Holdings:
    processes: int
    cgroups: int
    run_dirs: int
    mounts: int
    fds: int
    rss_kib: int

    @classmethod
    def of(cls, server: Server) -> "Holdings":
        return cls(
            processes=len(descendants(server.pid)),
            cgroups=len(cgroups_of(server.pid)),
            run_dirs=len(run_dirs_of(server.data_dir, server.pid)),
            mounts=len(mounts_under(server.data_dir)),
            fds=fd_count(server.pid),
            rss_kib=_rss_kib(server.pid),
        )

    def shape(self) -> tuple[int, int, int, int]:
        return (self.processes, self.cgroups, self.run_dirs, self.mounts)


async def settled(server: Server, target: Holdings | None, within: float = 60.0) -> Holdings:
    """The holdings once they stop changing (and, given a target, match its shape): the warm
    pool and fork servers refill in the background after a burst."""
    deadline = time.monotonic() + within
    last = Holdings.of(server)
    while True:
        await anyio.sleep(0.5)
        now = Holdings.of(server)
        steady = now.shape() == last.shape()
        if steady and (target is None or now.shape() == target.shape()):
            return now
        if time.monotonic() > deadline:
            return now
        last = now


# ---------------------------------------------------------------------------------------------
# The soak.
# ---------------------------------------------------------------------------------------------


@dataclass
class Report:
    runs: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_status: dict[str, int] = field(default_factory=dict)
    durations_ms: dict[str, list[float]] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    baseline: Holdings | None = None
    middle: Holdings | None = None
    end: Holdings | None = None
    markers_left: list[int] = field(default_factory=list)
    wall_s: float = 0.0

    def leftovers(self) -> dict[str, int]:
        """What the server holds after the soak beyond what it held after the warm-up."""
        assert self.baseline and self.end
        return {
            "processes": max(0, self.end.processes - self.baseline.processes),
            "cgroups": max(0, self.end.cgroups - self.baseline.cgroups),
            "run_dirs": max(0, self.end.run_dirs - self.baseline.run_dirs),
            "mounts": max(0, self.end.mounts - self.baseline.mounts),
            "marker_processes": len(self.markers_left),
        }

    def table(self) -> str:
        def pct(values: list[float], q: float) -> float:
            ordered = sorted(values)
            return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0

        lines = ["| kind | runs | p50 ms | p95 ms |", "|---|---:|---:|---:|"]
        every: list[float] = []
        for kind, _ in MIX:
            values = self.durations_ms.get(kind, [])
            every += values
            lines.append(f"| {kind} | {len(values)} | {pct(values, 0.5):.0f} | {pct(values, 0.95):.0f} |")
        lines.append(f"| **all** | {len(every)} | {pct(every, 0.5):.0f} | {pct(every, 0.95):.0f} |")
        lines += ["", "| status | replies |", "|---|---:|"]
        lines += [f"| {status} | {count} |" for status, count in sorted(self.by_status.items())]
        b, m, e = self.baseline, self.middle, self.end
        if b and e:
            lines += [
                "",
                "| server | after warm-up | halfway | after the soak |",
                "|---|---:|---:|---:|",
                f"| open fds | {b.fds} | {m.fds if m else '-'} | {e.fds} |",
                f"| RSS (MiB) | {b.rss_kib / 1024:.1f} | {m.rss_kib / 1024 if m else 0:.1f} | {e.rss_kib / 1024:.1f} |",
                f"| processes below it | {b.processes} | {m.processes if m else '-'} | {e.processes} |",
                f"| cgroups | {b.cgroups} | {m.cgroups if m else '-'} | {e.cgroups} |",
                f"| run directories | {b.run_dirs} | {m.run_dirs if m else '-'} | {e.run_dirs} |",
                f"| mounts under the data directory | {b.mounts} | {m.mounts if m else '-'} | {e.mounts} |",
            ]
            lines += ["", "leftovers: " + ", ".join(f"{k} {v}" for k, v in self.leftovers().items())]
        lines.append(f"failures: {len(self.failures)}; wall time {self.wall_s:.1f} s")
        return "\n".join(lines)


async def soak(server: Server, runs: int, concurrency: int = 6, seed: int = 12, progress: Callable[[int], None] | None = None) -> Report:
    report = Report()
    token = f"sbx-soak-{uuid.uuid4().hex}"
    # Warm-up: every one-shot kind once, so lazily made things (the fork server, the pool, the
    # artifact store) exist before the baseline.
    for i, kind in enumerate(k for k, _ in MIX if k in RUNNERS):
        try:
            await RUNNERS[kind](server, Job(kind, 100_000 + i, f"{token}-warm{i}"))
        except Failure as failure:
            report.failures.append(f"warm-up {kind}: {failure}")
    report.baseline = await settled(server, None)
    cells = SessionCells()
    await cells.create(server)
    kinds = plan(runs, seed)
    queue = list(enumerate(kinds))
    done = 0
    started = time.monotonic()

    async def worker() -> None:
        nonlocal done
        while queue:
            i, kind = queue.pop()
            job = Job(kind, i, f"{token}-{i}")
            t0 = time.monotonic()
            try:
                runner = cells.run if kind == "session_cell" else RUNNERS[kind]
                status = await runner(server, job)
            except Failure as failure:
                report.failures.append(f"#{i} {kind}: {failure}")
                status = "failed"
            except Exception as err:  # noqa: BLE001 - an unanswered call is a failure too
                report.failures.append(f"#{i} {kind}: no reply: {type(err).__name__}: {err}")
                status = "no_reply"
            report.durations_ms.setdefault(kind, []).append((time.monotonic() - t0) * 1000)
            report.by_kind[kind] = report.by_kind.get(kind, 0) + 1
            report.by_status[status] = report.by_status.get(status, 0) + 1
            report.runs += 1
            done += 1
            if done == runs // 2:
                report.middle = Holdings.of(server)
            if progress:
                progress(done)

    async with anyio.create_task_group() as tasks:
        for _ in range(concurrency):
            tasks.start_soon(worker)
    report.wall_s = time.monotonic() - started
    await cells.delete(server)
    report.end = await settled(server, report.baseline)
    deadline = time.monotonic() + 10
    while (left := marker_pids(token)) and time.monotonic() < deadline:
        await anyio.sleep(0.2)
    report.markers_left = left
    return report



# ---------------------------------------------------------------------------------------------
# The long soak's command line (`scripts/soak`).
# ---------------------------------------------------------------------------------------------


def main() -> int:
    import argparse
    import datetime
    import platform
    import shutil
    import subprocess
    import sys
    import tempfile
    from pathlib import Path

    from host_support import serve

    parser = argparse.ArgumentParser(description="The long hostile soak (issue 12): mixed calls through one server, then what it holds, counted from outside.")
    parser.add_argument("--runs", type=int, default=1000, help="calls to make (default 1000)")
    parser.add_argument("--concurrency", type=int, default=6, help="calls in flight at once (default 6)")
    parser.add_argument("--seed", type=int, default=12, help="seed of the mix's order")
    parser.add_argument("--binary", required=True, help="the snakebox binary")
    args = parser.parse_args()

    def progress(done: int) -> None:
        if done % 100 == 0 or done == args.runs:
            print(f"  {done}/{args.runs} calls answered", file=sys.stderr, flush=True)

    data = Path(tempfile.mkdtemp(prefix="snakebox-soak-"))
    data.chmod(0o755)
    problems: list[str] = []
    report = Report()

    async def run() -> None:
        nonlocal report
        async with serve(Path(args.binary), data, *FLAGS) as server:
            report = await soak(server, args.runs, args.concurrency, args.seed, progress)

    started = datetime.datetime.now(datetime.timezone.utc)
    try:
        anyio.run(run)
    except AssertionError as err:  # the stopped server left something behind
        problems.append(f"after the server stopped: {err}")
    repo = Path(__file__).resolve().parents[2]
    commit = subprocess.run(["git", "-C", str(repo), "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True).stdout.strip()
    version = subprocess.run([args.binary, "--version"], capture_output=True, text=True).stdout.strip()
    print(f"snakebox soak: {started:%Y-%m-%d %H:%M} UTC, commit {commit}{' (uncommitted changes)' if dirty else ''}, {version}")
    print(f"binary {args.binary}; {args.runs} runs, {args.concurrency} in flight, seed {args.seed}; server flags {' '.join(FLAGS)}")
    print(f"host: {platform.system()} {platform.release()}, {os.cpu_count()} cores, load average {' '.join(f'{x:.1f}' for x in os.getloadavg())} at the end\n")
    print(report.table())
    if report.baseline and report.end and any(report.leftovers().values()):
        problems.append(f"left behind: {report.leftovers()}")
    problems += report.failures
    for problem in problems[:50]:
        print("FAILED:", problem)
    shutil.rmtree(data, ignore_errors=True)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
