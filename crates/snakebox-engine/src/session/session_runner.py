"""snakebox's in-sandbox session runner: a small REPL that keeps one namespace alive.

Started once per session interpreter, inside the session's sandbox. The engine writes one
JSON request per line on stdin ({"code": "...", "marker": "...", "cell": N}); the runner
executes the code in the session's persistent `__main__` namespace, as a notebook cell,
through the one-shot runner's execution core (`runner.py`, written next to this file and
imported as a private module), so both report the same things the same way:

- the value of the last top-level expression (repr, and JSON when plain data; also kept as
  `_`), the names defined,
- an uncaught exception (type, message, traceback limited to the cell's frames), printed to
  stderr as the interpreter would; the interpreter carries on,
- matplotlib figures (shown with `plt.show()` or left open at the end of the cell; closed
  then, as a notebook does) and a PIL image as the last expression, as PNG images,
- `exit()` / `sys.exit()` end the cell, not the interpreter.

When the cell is done the runner flushes stdout and stderr, writes the request's marker on
both (the engine reads each stream up to it, so output is attributed to its request), then
one JSON line with the record on the private control pipe (descriptor 3, moved away before
any user code runs). stdin is moved away too: user code reading stdin sees end of file, never
the next request. The engine trusts the record only as far as it trusts the user's code.

Under a profile, the runner's `confine` comes first (the exec-deny program, then `site`), and
the profile's import policy guards the cells' own imports, as in a one-shot run.

Python 3.8+; standard library only.
"""

import importlib
import importlib.util
import json
import os
import sys
import types

RUNNER_FILE = "runner.py"
RUNNER_MODULE = "_snakebox_runner"


def _load_runner():
    """The one-shot runner, as a private module (a user's `runner.py` cannot shadow it)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), RUNNER_FILE)
    spec = importlib.util.spec_from_file_location(RUNNER_MODULE, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[RUNNER_MODULE] = module
    spec.loader.exec_module(module)
    return module


def _private(fd):
    """Move `fd` to a high close-on-exec number and close the original."""
    import fcntl

    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200)
    os.close(fd)
    return moved


def _write_all(fd, data, _write=os.write, _memoryview=memoryview):
    view = _memoryview(data)
    while view:
        try:
            written = _write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[written:]


def _is_cell(filename):
    return filename.startswith("<cell ")


def main():
    runner = _load_runner()
    options = sys.argv[1:]
    # First, as the one-shot runner does: the profile's exec-deny program, then the
    # environment's site code (the interpreter was started with -S when there is a program).
    runner.confine(options)
    # The interpreter's parent reports how it really ended (an `os._exit(137)` is an exit
    # code, not a SIGKILL) on the control channel; see `runner.report_end_from_parent`.
    runner.report_end_from_parent(3)
    if "--proxy" in options:
        # Before any cell: the session's way out (see `runner.start_bridge`).
        runner.start_bridge(options[options.index("--proxy") + 1])
    # The profile's import policy, for the cells' own code.
    runner.install_import_policy(os.path.dirname(os.path.abspath(__file__)), _is_cell)
    # Buffered: a request line is read in one or two system calls, not one per byte. The
    # engine sends the next request only after this one's answer, so the buffer never holds
    # a request ahead of the cell that is running.
    requests = os.fdopen(_private(0), "rb", buffering=64 * 1024)
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)
        os.close(devnull)
    control = _private(3)
    runner.install_pyplot_hook()

    namespace_module = types.ModuleType("__main__")
    namespace_module.__dict__.update({"__builtins__": __builtins__, "__spec__": None, "__loader__": None})
    sys.modules["_snakebox_session_runner"] = sys.modules["__main__"]
    sys.modules["__main__"] = namespace_module
    sys.argv = [""]
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = ""
    namespace = namespace_module.__dict__

    # Private references, taken before any cell runs: a cell that replaces `json.dumps`,
    # `os.write`, `importlib.invalidate_caches` or the runner's functions (module attributes)
    # does not change how later cells are run and answered. What a cell can still forge, by
    # tampering with these objects themselves, is stated in SECURITY.md (S-04).
    readline = requests.readline
    loads = json.loads
    encode = json.JSONEncoder(default=str).encode
    invalidate_caches = importlib.invalidate_caches
    run_code = runner.run_code
    take_blocked = runner.take_blocked
    flush = runner._flush
    short = runner._short
    write_all = _write_all
    _BaseException, _ValueError, _int = BaseException, ValueError, int

    while True:
        line = readline()
        if not line:
            return 0
        try:
            request = loads(line)
        except _ValueError:
            continue
        marker = request.get("marker", "").encode("utf-8")
        filename = "<cell %d>" % _int(request.get("cell", 0))
        # Packages installed since the last cell must be importable now.
        invalidate_caches()
        try:
            record, value = run_code(request.get("code", ""), filename, namespace, close_figures=True)
            if value is not None:
                namespace["_"] = value
            # What the profile blocked during this cell, for its events.
            take_blocked(record)
        except _BaseException as err:  # noqa: BLE001 - the runner itself failed: say so, go on
            try:
                reason = short(err)
            except _BaseException:  # noqa: BLE001
                reason = "?"
            record = {"exit_code": 1, "notes": ["the session runner failed: %s" % (reason,)]}
        flush()
        write_all(1, marker)
        write_all(2, marker)
        # The host takes only a line that starts with this request's marker as its answer:
        # anything the cell itself wrote to the channel is dropped instead of shifting every
        # later answer by one.
        try:
            payload = encode(record).replace("\n", " ") + "\n"
        except _BaseException as err:  # noqa: BLE001 - an unencodable value: say so
            payload = '{"exit_code": %d, "notes": ["the cell\'s record could not be encoded"]}\n' % (
                record.get("exit_code", 1) if isinstance(record.get("exit_code"), _int) else 1
            )
            del err
        write_all(control, marker + payload.encode("utf-8", "replace"))


if __name__ == "__main__":
    sys.exit(main())
