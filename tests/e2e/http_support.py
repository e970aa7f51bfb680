"""A `snakebox serve --http` the caller owns, and API keys for it: shared by the HTTP, client
and web UI tests and by the HTTP load benchmark (`bench/http_load.py`), so it needs nothing
but the standard library. Its servers run on the suite's backend (backend_support.py)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Iterator

from backend_support import backend_flags


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_key(binary: Path, data: Path, tenant: str) -> str:
    """A new API key of `tenant`, made by `snakebox keys add` (the key is its last line)."""
    done = subprocess.run(
        [str(binary), "keys", "add", "--tenant", tenant, "--data-dir", str(data)],
        capture_output=True, text=True, timeout=60, check=True,
    )
    key = done.stdout.strip().splitlines()[-1]
    assert key.startswith("sbx_") and len(key) == 68, done
    assert key not in done.stderr
    return key


@contextlib.contextmanager
def http_server(binary: Path, data: Path, *args: str, log_path: Path | None = None,
                env: dict[str, str] | None = None) -> Iterator[tuple[subprocess.Popen, str]]:
    """`snakebox serve --http` on a free loopback port with `data` as its data directory; yields
    the process and its base URL once it accepts connections, and stops it with SIGTERM. Its
    log (warnings and errors) goes to `log_path` when given, for the test to read; `env` adds
    to its environment."""
    port = free_port()
    # The server's log goes to a file, not a pipe nobody reads (a full pipe would stall it).
    with (open(log_path, "w+b") if log_path else tempfile.TemporaryFile()) as log:
        proc = subprocess.Popen(
            [str(binary), "serve", "--http", f"127.0.0.1:{port}", "--data-dir", str(data), "--no-warm-cache", *args, *backend_flags(args)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log,
            env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "SNAKEBOX_LOG": "warn", **(env or {})},
        )
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
                if proc.poll() is not None:
                    log.seek(0)
                    raise RuntimeError(f"the server exited at start: {log.read().decode(errors='replace')}")
                time.sleep(0.1)
            yield proc, f"http://127.0.0.1:{port}"
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
