"""The short hostile soak in CI (issue 12): 200 mixed calls through one server, six in
flight at once (see `soak_support.py` for the mix and the counts). Every call must be
answered with the right status and content; afterwards the server holds no more processes,
cgroups, run directories or mounts than after its warm-up, no run's marker process is left,
its open file descriptors are flat and its memory bounded; once stopped it leaves nothing.

`scripts/soak` runs the same soak longer (1,000 runs and more) for releases; RELIABILITY.md
has the figures of its last run.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from conftest import have_bwrap
from host_support import serve
from soak_support import FLAGS, MIX, soak

pytestmark = [
    pytest.mark.anyio,
    # Under docker it answers every call rightly (it found the lost-request bug of pooled
    # containers) except its timeout cases' output: six calls in flight drain the warm pool, and
    # a cold container's interpreter start (counted in the wall time, as a cold native run's)
    # can pass the cases' 1-2 s budget on a loaded machine before the script printed anything.
    pytest.mark.native_only("its 1-2 s timeout cases expect output first, which a cold container's start can outlast on a loaded machine (docs/src/backends.md)"),
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
    pytest.mark.skipif(os.geteuid() != 0, reason="mounts, cgroups and the fork server need a root server"),
]

RUNS = 200
# Descriptors the server may hold beyond its warm-up count once it settled (a connection of
# the egress proxy or a pool sandbox being replaced at that moment).
FD_MARGIN = 8
# Memory the server may add over 200 runs (allocator caches and arenas; a leak of one output
# buffer per run would pass it within the first few dozen).
RSS_MARGIN_KIB = 32 * 1024


async def test_hostile_soak_leaves_nothing_behind(snakebox_bin: Path, tmp_path: Path) -> None:
    data = tmp_path / "data"
    data.mkdir()
    data.chmod(0o755)
    async with serve(snakebox_bin, data, *FLAGS) as server:
        report = await soak(server, RUNS)
        print("\n" + report.table())
    # Every call answered, with the status and content it should have.
    assert report.failures == [], "\n".join(report.failures[:20])
    assert report.runs == RUNS
    assert set(report.by_kind) == {kind for kind, _ in MIX}, report.by_kind
    # Nothing left: proof of life first (the server held these while it served).
    assert report.baseline and report.end
    assert report.baseline.processes and report.baseline.cgroups and report.baseline.run_dirs and report.baseline.mounts, report.baseline
    assert report.leftovers() == {"processes": 0, "cgroups": 0, "run_dirs": 0, "mounts": 0, "marker_processes": 0}, report.table()
    assert report.end.fds <= report.baseline.fds + FD_MARGIN, report.table()
    assert report.end.rss_kib <= report.baseline.rss_kib + RSS_MARGIN_KIB, report.table()
