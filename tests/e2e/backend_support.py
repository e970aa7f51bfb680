"""Which sandbox backend the end-to-end suite's servers run on, chosen by `SNAKEBOX_E2E_BACKEND`:
`native` (the default: bubblewrap), `docker` (`--sandbox-backend docker`, issue 17) or `runsc`
(the same with `--docker-runtime runsc`, gVisor). Every helper that starts the binary (`serve`,
`run`, `check`) adds `backend_flags()`. Standard library only: the HTTP load benchmark imports it
through http_support."""

from __future__ import annotations

import os
from typing import Sequence

BACKEND_FLAGS: dict[str, tuple[str, ...]] = {
    "native": (),
    "docker": ("--sandbox-backend", "docker"),
    "runsc": ("--sandbox-backend", "docker", "--docker-runtime", "runsc"),
}
E2E_BACKEND = os.environ.get("SNAKEBOX_E2E_BACKEND", "native")
if E2E_BACKEND not in BACKEND_FLAGS:
    raise RuntimeError(f"SNAKEBOX_E2E_BACKEND={E2E_BACKEND!r}: expected one of {', '.join(BACKEND_FLAGS)}")


def docker_backend() -> bool:
    """Whether this pass runs every server on the docker backend (runc or gVisor)."""
    return E2E_BACKEND != "native"


def backend_flags(args: Sequence[str] = ()) -> tuple[str, ...]:
    """The flags that put a `serve`, `run` or `check` with these arguments on this pass's
    backend; none when the command already names its backend (the docker and attack suites,
    the fail-closed tests choose their own)."""
    if any(arg == "--sandbox-backend" or arg.startswith("--sandbox-backend=") for arg in args):
        return ()
    return BACKEND_FLAGS[E2E_BACKEND]


def reported_backend() -> str:
    """What `check_environment` names as the backend of this pass's servers."""
    return "native" if E2E_BACKEND == "native" else "docker"


# Reasons of `native_only` and `not_runsc` shared by several files.
HOST_PROC_ORACLE = "the test finds the run's marker process in host /proc, and gVisor's processes are not host processes"
FORK_SERVER_ONLY = "the fork server forks runs into bubblewrap sandboxes; the docker backend has none (it is always off there)"
KILLED_SERVER_ORACLE = (
    "the fault suite finds each stage's process among the server's descendants and judges a SIGKILLed server by "
    "its process tree and its `snakebox-<pid>-*` cgroups; under docker, runs, installs and session interpreters are "
    "containers of the engine (not the server's children), which outlive a SIGKILLed server until the next server "
    "removes them (docs/src/backends.md; test_docker.py::test_a_killed_servers_containers_are_removed_by_the_next_one)"
)
