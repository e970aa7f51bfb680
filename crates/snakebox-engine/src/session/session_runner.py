"""snakebox's in-sandbox session runner: a small REPL that keeps one namespace alive.

Started once per session interpreter, inside the session's sandbox. The engine writes one
JSON request per line on stdin ({"code": "...", "marker": "...", "cell": N}); the runner
executes the code in the session's persistent `__main__` namespace, as a notebook cell:

- the value of the last top-level expression is reported (repr, and JSON when plain data),
- an uncaught exception is reported (type, message, traceback limited to the cell's frames)
  and printed to stderr as the interpreter would, and the interpreter carries on,
- `exit()` / `sys.exit()` end the cell, not the interpreter.

When the cell is done the runner flushes stdout and stderr, writes the request's marker on
both (the engine reads each stream up to it, so output is attributed to its request), then
one JSON line with the record on the private control pipe (descriptor 3, moved away before
any user code runs). stdin is moved away too: user code reading stdin sees end of file, never
the next request. The engine trusts the record only as far as it trusts the user's code.

Python 3.8+; standard library only.
"""

import ast
import fcntl
import importlib
import json
import linecache
import os
import sys
import traceback
import types

REPR_MAX_CHARS = 10000
JSON_MAX_CHARS = 65536
MESSAGE_MAX_CHARS = 10000
TRACEBACK_MAX_CHARS = 50000
MAX_NAMES = 500


def _private(fd):
    """Move `fd` to a high close-on-exec number and close the original."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 200)
    os.close(fd)
    return moved


def _type_name(value):
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", kind.__name__)
    if module in ("builtins", "__main__", ""):
        return name
    return "%s.%s" % (module, name)


def _short(err):
    try:
        return ("%s: %s" % (type(err).__name__, err))[:300]
    except Exception:  # noqa: BLE001
        return type(err).__name__


def _plain(value, depth=0):
    if depth > 20:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if type(value) is int:
        return True
    if type(value) is float:
        return value == value and value not in (float("inf"), float("-inf"))
    if type(value) in (list, tuple):
        return len(value) <= 10000 and all(_plain(item, depth + 1) for item in value)
    if type(value) is dict:
        return len(value) <= 10000 and all(
            isinstance(key, str) and _plain(item, depth + 1) for key, item in value.items()
        )
    return False


def _describe_value(value):
    try:
        text = repr(value)
    except Exception as err:  # noqa: BLE001
        text = "<repr() failed: %s>" % _short(err)
    if len(text) > REPR_MAX_CHARS:
        text = text[:REPR_MAX_CHARS] + "... [%d characters truncated]" % (len(text) - REPR_MAX_CHARS)
    described = {"repr": text, "type_name": _type_name(value), "json": None}
    try:
        if _plain(value) and len(json.dumps(value, allow_nan=False)) <= JSON_MAX_CHARS:
            described["json"] = value
    except Exception:  # noqa: BLE001
        pass
    return described


def _compile(source, filename):
    tree = ast.parse(source, filename, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    body = compile(tree, filename, "exec", dont_inherit=True)
    expression = None
    if last is not None:
        expression = compile(last, filename, "eval", dont_inherit=True)
    return body, expression


def _describe_exception(err, filename, compiling):
    tb = err.__traceback__
    # Drop the runner's own frames from the head.
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    if compiling:
        lines = traceback.format_exception_only(type(err), err)
    else:
        lines = traceback.format_exception(type(err), err, tb)
    text = "".join(lines)
    if len(text) > TRACEBACK_MAX_CHARS:
        text = "[... %d characters truncated ...]\n" % (len(text) - TRACEBACK_MAX_CHARS) + text[-TRACEBACK_MAX_CHARS:]
    line = None
    if isinstance(err, SyntaxError) and err.filename == filename:
        line = err.lineno
    walk = tb
    while walk is not None:
        if walk.tb_frame.f_code.co_filename == filename:
            line = walk.tb_lineno
        walk = walk.tb_next
    try:
        message = str(err)
    except Exception as inner:  # noqa: BLE001
        message = "<str() failed: %s>" % _short(inner)
    return text, {
        "type_name": _type_name(err),
        "message": message[:MESSAGE_MAX_CHARS],
        "traceback": text,
        "line": line,
    }


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def _write_all(fd, data):
    view = memoryview(data)
    while view:
        try:
            written = os.write(fd, view)
        except InterruptedError:
            continue
        except OSError:
            return
        view = view[written:]


def _run_cell(source, filename, namespace):
    record = {"value": None, "exception": None, "exit_code": 0}
    lines = source.splitlines(True)
    linecache.cache[filename] = (len(source), None, lines, filename)
    compiling = True
    try:
        body, expression = _compile(source, filename)
        compiling = False
        exec(body, namespace)
        if expression is not None:
            value = eval(expression, namespace)
            if value is not None:
                record["value"] = _describe_value(value)
                namespace["_"] = value
    except SystemExit as err:
        code = err.code
        if code is None:
            record["exit_code"] = 0
        elif isinstance(code, int) and not isinstance(code, bool):
            record["exit_code"] = code & 0xFF
        else:
            try:
                sys.stderr.write("%s\n" % (code,))
            except Exception:  # noqa: BLE001
                pass
            record["exit_code"] = 1
    except BaseException as err:  # noqa: BLE001 - report everything the cell raised
        text, record["exception"] = _describe_exception(err, filename, compiling)
        _flush()
        try:
            sys.stderr.write(text)
        except Exception:  # noqa: BLE001
            pass
        record["exit_code"] = 1
    return record


def main():
    requests = os.fdopen(_private(0), "rb", buffering=0)
    devnull = os.open(os.devnull, os.O_RDONLY)
    if devnull != 0:
        os.dup2(devnull, 0)
        os.close(devnull)
    control = _private(3)

    namespace_module = types.ModuleType("__main__")
    namespace_module.__dict__.update({"__builtins__": __builtins__, "__spec__": None, "__loader__": None})
    sys.modules["_snakebox_session_runner"] = sys.modules["__main__"]
    sys.modules["__main__"] = namespace_module
    sys.argv = [""]
    if sys.path and sys.path[0] == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = ""
    namespace = namespace_module.__dict__

    while True:
        line = requests.readline()
        if not line:
            return 0
        try:
            request = json.loads(line)
        except ValueError:
            continue
        marker = request.get("marker", "").encode("utf-8")
        filename = "<cell %d>" % int(request.get("cell", 0))
        # Packages installed since the last cell must be importable now.
        importlib.invalidate_caches()
        record = _run_cell(request.get("code", ""), filename, namespace)
        _flush()
        names = [name for name in list(namespace) if not (name.startswith("__") and name.endswith("__"))]
        record["names"] = [str(name)[:200] for name in names[:MAX_NAMES]]
        _write_all(1, marker)
        _write_all(2, marker)
        payload = json.dumps(record, default=str).replace("\n", " ") + "\n"
        _write_all(control, payload.encode("utf-8", "replace"))


if __name__ == "__main__":
    sys.exit(main())
