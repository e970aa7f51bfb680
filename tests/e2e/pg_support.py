"""A throwaway PostgreSQL cluster for the shared-store tests (issue 35): `initdb` in a
temporary directory, a server on a free loopback port, stopped and removed afterwards. The
binaries are found in `SNAKEBOX_PG_BIN`, Debian's /usr/lib/postgresql/<version>/bin (package
`postgresql`) or on PATH; without them the tests skip, saying so. PostgreSQL refuses to run as
root: as root the cluster belongs to `SNAKEBOX_PG_USER`, `postgres` or `cloudsdk` (the first
that exists) and its commands run through `runuser`. Standard library only."""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Iterator

from http_support import free_port

BINARIES = ("initdb", "pg_ctl", "postgres")


def pg_bin() -> Path | None:
    """The directory holding initdb, pg_ctl and postgres, if PostgreSQL is installed."""
    def has(d: Path) -> bool:
        return all((d / b).is_file() for b in BINARIES)

    explicit = os.environ.get("SNAKEBOX_PG_BIN")
    if explicit:
        return Path(explicit) if has(Path(explicit)) else None
    debian = sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)
    path = [Path(p) for p in os.environ.get("PATH", "").split(os.pathsep) if p]
    return next((d for d in [*debian, *path] if has(d)), None)


def _cluster_user() -> pwd.struct_passwd | None:
    if os.geteuid() != 0:
        return None
    for name in [os.environ.get("SNAKEBOX_PG_USER"), "postgres", "cloudsdk"]:
        if not name:
            continue
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root, and no user to run PostgreSQL as (set SNAKEBOX_PG_USER)")


# Each running cluster's (stop, start), by URL: a test takes the database away and back.
_CONTROLS: dict = {}


def pg_stop(url: str) -> None:
    """Stop the cluster of `url` at once (as a crash would)."""
    _CONTROLS[url][0]()


def pg_start(url: str) -> None:
    """Start the cluster of `url` again, on the same port."""
    _CONTROLS[url][1]()


@contextlib.contextmanager
def pg_cluster() -> Iterator[str]:
    """A running cluster; yields its URL (`postgres://snakebox:PASSWORD@127.0.0.1:PORT/postgres`,
    password authentication, so the tests can check the password is never shown)."""
    binaries = pg_bin()
    assert binaries is not None, "check pg_bin() first"
    user = _cluster_user()
    root = Path(tempfile.mkdtemp(prefix="snakebox-pg-"))
    if user:
        os.chown(root, user.pw_uid, user.pw_gid)

    def run(binary: str, *args: str) -> None:
        argv = [str(binaries / binary), *args]
        if user:
            argv = ["runuser", "-u", user.pw_name, "--", *argv]
        done = subprocess.run(argv, cwd=root, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, f"{binary} failed: {done.stdout}\n{done.stderr}"

    password = "pw-" + os.urandom(8).hex()
    pwfile = root / "pwfile"
    pwfile.write_text(password + "\n")
    if user:
        os.chown(pwfile, user.pw_uid, user.pw_gid)
    port = free_port()
    data = root / "data"
    run("initdb", "-D", str(data), "-U", "snakebox", "--auth=scram-sha-256", f"--pwfile={pwfile}",
        "-E", "UTF8", "--no-sync")
    def start() -> None:
        run("pg_ctl", "-D", str(data), "-l", str(root / "log"), "-o",
            f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off", "-w", "start")

    def stop() -> None:
        run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")

    start()
    url = f"postgres://snakebox:{password}@127.0.0.1:{port}/postgres"
    _CONTROLS[url] = (stop, start)
    try:
        yield url
    finally:
        _CONTROLS.pop(url, None)
        with contextlib.suppress(Exception):
            run("pg_ctl", "-D", str(data), "-m", "immediate", "stop")
        shutil.rmtree(root, ignore_errors=True)


def psql(url: str, sql: str) -> list[list[str]]:
    """Rows of `sql` run by Debian's psql (or the one next to the server), as text."""
    binary = shutil.which("psql") or str((pg_bin() or Path("/usr/bin")) / "psql")
    done = subprocess.run([binary, url, "-At", "-F", "\t", "-c", sql],
                          capture_output=True, text=True, timeout=60, check=True)
    return [line.split("\t") for line in done.stdout.splitlines() if line]
