#!/usr/bin/env python3
"""A normal user's session files through fuse2fs (issue 33): what bounding a normal user's
sessions' disk while calls run costs.

A normal user's server serves each tenant's share of the sessions' disk (an ext4 image) over
FUSE with `fuse2fs`; before, a session's files were a plain directory (checked between calls
only). This times, in a normal user's server (`runuser`), one session's work in each of
`--rounds` rounds:

- `create_session` with `--dependency` installed (uv's cache warm: one untimed install first);
- the first cell, importing that dependency in a fresh interpreter (its files read from the
  session's venv for the first time);
- a cell writing 1000 files of 100 bytes; one writing 100 MiB and `fsync`ing; one reading
  them back;

for `--snakebox` and, when given, `--baseline` (a build that keeps plain directories, e.g.
main before fuse2fs), alternating, each with a data directory of its own. Prints the median
of each measure per binary and their ratio, with the machine's load.

    target/e2e-venv/bin/python bench/sessions_disk.py --as-user snakebox-bench \\
        --snakebox target/release/snakebox --baseline /tmp/snakebox-main
"""

from __future__ import annotations

import argparse
import os
import pwd
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters

SMALL = "import os\nos.makedirs('many', exist_ok=True)\nfor i in range(1000):\n    open(f'many/{i}', 'w').write('x' * 100)\n"
WRITE = "import os\nwith open('big', 'wb') as f:\n    for _ in range(100):\n        f.write(b'x' * (1 << 20))\n    f.flush()\n    os.fsync(f.fileno())\n"
READ = "with open('big', 'rb') as f:\n    while f.read(1 << 20):\n        pass\n"
MEASURES = ["create_session (s)", "first import (ms)", "1000 small files (ms)", "100 MiB write + fsync (ms)", "100 MiB read (ms)"]


async def call(client: Client, tool: str, **arguments) -> dict:
    result = await client.call_tool(tool, arguments)
    text = "".join(getattr(block, "text", "") for block in result.content)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(f"{tool} failed: {text[:500]}")
    return result.structured_content


async def one_round(params: StdioServerParameters, dependency: str, module: str, warm: bool) -> dict[str, float]:
    async with Client(params, mode="auto", read_timeout_seconds=900) as client:
        report = await call(client, "check_environment")
        how = report["sessions"]["disk_quota"].split(":")[0]
        if warm:
            first = await call(client, "create_session", dependencies=[dependency])
            await call(client, "delete_session", session_id=first["session_id"])
        times: dict[str, float] = {}
        start = time.perf_counter()
        session = (await call(client, "create_session", dependencies=[dependency]))["session_id"]
        times[MEASURES[0]] = time.perf_counter() - start
        for name, script in zip(MEASURES[1:], [f"import {module}", SMALL, WRITE, READ]):
            start = time.perf_counter()
            result = await call(client, "execute_python", session_id=session, script=script, timeout_seconds=600)
            if result["status"] != "ok":
                raise RuntimeError(f"{name}: {result}")
            times[name] = (time.perf_counter() - start) * 1000
        await call(client, "delete_session", session_id=session)
        times["how"] = how  # type: ignore[assignment]
        return times


def setup(binary: Path, uv: Path, user: pwd.struct_passwd, work: Path, name: str) -> StdioServerParameters:
    home = work / name
    home.mkdir(mode=0o755)
    for tool, source in (("snakebox", binary), ("uv", uv)):
        shutil.copy2(source, home / tool)
        (home / tool).chmod(0o755)
    data = home / "data"
    data.mkdir(mode=0o700)
    os.chown(data, user.pw_uid, user.pw_gid)
    return StdioServerParameters(
        command=shutil.which("runuser") or "/usr/sbin/runuser",
        args=["-u", user.pw_name, "--", str(home / "snakebox"), "serve", "--data-dir", str(data), "--no-warm-cache", "--uv-path", str(home / "uv")],
        env={"SNAKEBOX_LOG": "warn", "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(home)},
        cwd=str(home),
    )


async def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--as-user", required=True, metavar="USER", help="an existing normal user (e.g. `useradd -m snakebox-bench`)")
    parser.add_argument("--snakebox", required=True, type=Path)
    parser.add_argument("--baseline", type=Path, help="a build whose normal user's sessions keep plain directories")
    parser.add_argument("--uv", type=Path, default=shutil.which("uv"), help="the uv binary itself (not a pyenv shim)")
    parser.add_argument("--dependency", default="polars>=1.0")
    parser.add_argument("--module", default="polars")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    user = pwd.getpwnam(args.as_user)
    binaries = {"snakebox": args.snakebox}
    if args.baseline:
        binaries["baseline"] = args.baseline
    with tempfile.TemporaryDirectory(prefix="sessions-disk-") as tmp:
        work = Path(tmp)
        work.chmod(0o755)
        params = {name: setup(binary, args.uv, user, work, name) for name, binary in binaries.items()}
        samples: dict[str, list[dict]] = {name: [] for name in binaries}
        loads = [os.getloadavg()]
        for round_ in range(args.rounds):
            for name in binaries:
                samples[name].append(await one_round(params[name], args.dependency, args.module, warm=round_ == 0))
        loads.append(os.getloadavg())
    print(f"machine: {os.cpu_count()} CPUs, Linux {os.uname().release}; load at start {' '.join(f'{x:.2f}' for x in loads[0])}, at end {' '.join(f'{x:.2f}' for x in loads[1])}")
    for name, binary in binaries.items():
        print(f"{name}: {binary} — sessions' disk {samples[name][0]['how']}")
    header = "| measure (median of %d) | %s |" % (args.rounds, " | ".join(binaries))
    if args.baseline:
        header += " ratio |"
    print()
    print(header)
    print("|---" * (len(binaries) + 1 + bool(args.baseline)) + "|")
    for measure in MEASURES:
        medians = {name: statistics.median(s[measure] for s in samples[name]) for name in binaries}
        row = f"| {measure} | " + " | ".join(f"{medians[name]:.1f}" for name in binaries) + " |"
        if args.baseline:
            row += f" {medians['snakebox'] / medians['baseline']:.1f}× |"
        print(row)
    return 0


if __name__ == "__main__":
    sys.exit(anyio.run(main))
