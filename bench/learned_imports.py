#!/usr/bin/env python3
"""What a fork server that learned a run's imports saves (issue 19, `crates/snakebox-engine/src/learn.rs`).

Starts `snakebox serve` (own fresh --data-dir), runs a script that imports a module below a
declared package (default: `import scipy.stats` with `scipy` declared) once to build the
environment, waits for its compilation and its fork server (which preloads the declared
package's top-level module only), then times calls: before the fork server learned the module (the first two
forked runs teach it), and once `check_environment` lists it among what the fork server
preloaded. Prints the medians and what the runs found loaded.

    target/e2e-venv/bin/python bench/learned_imports.py [--snakebox PATH] [-n 10]
        [--dependency scipy] [--module scipy.stats]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import REPO, RawClient, passed_through  # noqa: E402

SCRIPT = "import sys\nfound = {module!r} in sys.modules\nimport {module}\nprint(found)\n"


async def fork_server_has(client: RawClient, module: str) -> bool:
    report = await client.request("tools/call", {"name": "check_environment", "arguments": {}})
    details = report["structuredContent"]["warm_pool"]["fork_server_details"]
    return any(module in d["preloaded"] for d in details)


async def compiled(client: RawClient, seconds: float) -> None:
    """Wait until no environment is being compiled in the background (the environment's fork
    server gives way to one of its compiled copy when that is published)."""
    deadline = time.monotonic() + seconds
    while True:
        report = await client.request("tools/call", {"name": "check_environment", "arguments": {}})
        if not report["structuredContent"]["cache"]["compilation"]["pending"]:
            return
        if time.monotonic() > deadline:
            raise SystemExit(f"the environment was not compiled within {seconds:.0f} s")
        await asyncio.sleep(0.2)


async def wait_for(client: RawClient, module: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not await fork_server_has(client, module):
        if time.monotonic() > deadline:
            raise SystemExit(f"no fork server preloaded {module} within {seconds:.0f} s")
        await asyncio.sleep(0.2)


async def timed(client: RawClient, script: str, dependencies: list[str]) -> tuple[float, str]:
    started = time.perf_counter()
    result = await client.execute(script, dependencies)
    elapsed = (time.perf_counter() - started) * 1e3
    if result["status"] != "ok":
        raise SystemExit(f"the run failed: {result}")
    return elapsed, result["stdout"].strip()


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--snakebox", default=str(REPO / "target" / "release" / "snakebox"))
    parser.add_argument("-n", "--rounds", type=int, default=10)
    parser.add_argument("--dependency", default="scipy")
    parser.add_argument("--module", default="scipy.stats")
    args = parser.parse_args()
    script = SCRIPT.format(module=args.module)
    top = args.module.partition(".")[0]
    dependencies = [args.dependency]
    env = {"SNAKEBOX_LOG": "warn", "PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(Path.home()), **passed_through()}
    with tempfile.TemporaryDirectory() as data:
        async with RawClient([args.snakebox, "serve", "--data-dir", data], env) as client:
            elapsed, _ = await timed(client, script, dependencies)
            print(f"first run (builds the environment): {elapsed:.0f} ms")
            await compiled(client, 300)
            await wait_for(client, top, 300)
            before = [await timed(client, script, dependencies) for _ in range(2)]
            await wait_for(client, args.module, 300)
            after = [await timed(client, script, dependencies) for _ in range(args.rounds)]
    for label, samples in (("before (it preloads " + top + ")", before), ("learned " + args.module, after)):
        times = [t for t, _ in samples]
        found = sorted({f for _, f in samples})
        print(f"{label}: median {statistics.median(times):.1f} ms over {len(times)} calls; found it loaded: {', '.join(found)}")


if __name__ == "__main__":
    asyncio.run(main())
