"""snakebox's in-sandbox runner (embedded in the engine, written next to the user's script).

Runs the user's script the way `python script.py` would (as `__main__`, same `sys.argv[0]`,
same `sys.path[0]`), plus what a notebook user sees:

- the value of the last top-level expression (repr, and JSON when it is plain data),
- the top-level names the script defined,
- the uncaught exception with a traceback limited to the script's own frames,
- matplotlib figures (shown with `plt.show()` or left open) and a PIL image as the last
  expression, as PNG images.

The execution core (`run_code`) is shared with the session runner (`session_runner.py`), which
imports this file as a module and runs each cell of a session through it.

Everything is reported as ONE JSON record written at the end to a private pipe (the
descriptor given as argv[2], moved away from 3 before the script runs). The engine trusts the
record only as far as it trusts the user's code: the script can write to that pipe too, so
the engine parses it defensively and takes the run's status from the supervisor, never from
here. stdout and stderr are left to the script.

Python 3.8+; standard library only.
"""

import ast
import base64
import io
import json
import linecache
import os
import sys
import traceback
import types

RECORD_VERSION = 1
SCRIPT_NAME = "script.py"
REPR_MAX_CHARS = 10000
JSON_MAX_CHARS = 65536
MESSAGE_MAX_CHARS = 10000
TRACEBACK_MAX_CHARS = 50000
MAX_NAMES = 500
# Modules a run reports it imported (`--report-imports`), at most.
MAX_IMPORTED = 256
MAX_IMAGES = 16
# A figure is re-rendered at a lower resolution until it fits INLINE_TARGET (the engine's
# inline bound); past IMAGE_MAX_BYTES it is dropped, past the total it is not rendered.
INLINE_TARGET = 1 << 20
# Model providers refuse images larger than this on a side (artifacts.rs MAX_INLINE_PIXELS).
MAX_PIXELS = 8000
IMAGE_MAX_BYTES = 4 << 20
IMAGES_TOTAL_BYTES = 10 << 20

IMPORT_POLICY_FILE = "imports.json"
MAX_BLOCKED = 20

_images = []
_images_bytes = 0
_blocked = []
_notes = []
_captured_figures = []
_keep = []


def _note(text):
    if len(_notes) < 20:
        _notes.append(text[:500])


def _add_image(data, name, source):
    global _images_bytes
    if len(_images) >= MAX_IMAGES:
        _note("%s not returned: more than %d images" % (name, MAX_IMAGES))
        return
    if len(data) > IMAGE_MAX_BYTES or _images_bytes + len(data) > IMAGES_TOTAL_BYTES:
        _note("%s not returned: %d bytes is too large" % (name, len(data)))
        return
    _images_bytes += len(data)
    _images.append(
        {
            "name": name,
            "source": source,
            "data": base64.b64encode(data).decode("ascii"),
        }
    )


def _render_figure(figure):
    """PNG bytes of a matplotlib figure, downscaled until it fits the inline bound, and never
    more than MAX_PIXELS on a side (model providers refuse larger images)."""
    dpi = figure.get_dpi() or 100
    try:
        longest = max(figure.get_size_inches())
        if longest * dpi > MAX_PIXELS:
            dpi = MAX_PIXELS / longest
    except Exception:  # noqa: BLE001 - an odd figure keeps its own dpi
        pass
    data = b""
    for scale in (1.0, 0.6, 0.35):
        buffer = io.BytesIO()
        figure.savefig(buffer, format="png", dpi=max(20, dpi * scale))
        data = buffer.getvalue()
        if len(data) <= INLINE_TARGET:
            break
    return data


def _capture_figure(figure, source):
    # Identity, not id(): a closed figure's id can be reused by the next one.
    if any(seen is figure for seen in _captured_figures):
        return
    _captured_figures.append(figure)
    try:
        data = _render_figure(figure)
    except Exception as err:  # noqa: BLE001 - a broken figure must not break the run
        _note("a matplotlib figure could not be rendered: %s" % _short(err))
        return
    _add_image(data, "figure-%d.png" % len(_captured_figures), source)


def _capture_open_figures(close):
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is None:
        return
    try:
        numbers = list(pyplot.get_fignums())
    except Exception:  # noqa: BLE001
        return
    for number in numbers:
        try:
            figure = pyplot.figure(number)
        except Exception:  # noqa: BLE001
            continue
        _capture_figure(figure, "figure")
    if close and numbers:
        try:
            pyplot.close("all")
        except Exception:  # noqa: BLE001
            pass


def _patch_pyplot(pyplot):
    """`plt.show()` under the non-interactive Agg backend captures and closes the figures
    (as a notebook does) instead of warning that it cannot show them."""
    original = getattr(pyplot, "show", None)
    if original is None or getattr(original, "_snakebox_capture", False):
        return

    def show(*args, **kwargs):
        try:
            backend = str(pyplot.get_backend()).lower()
        except Exception:  # noqa: BLE001
            backend = ""
        if backend != "agg":
            return original(*args, **kwargs)
        _capture_open_figures(close=True)
        return None

    show.__doc__ = original.__doc__
    show.__wrapped__ = original
    show._snakebox_capture = True
    pyplot.show = show


class _LoaderHook:
    """Wraps the real loader of `matplotlib.pyplot` to patch it once it is executed."""

    def __init__(self, inner):
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)
        try:
            _patch_pyplot(module)
        except Exception:  # noqa: BLE001
            pass

    def __getattr__(self, name):
        return getattr(self._inner, name)


class _PyplotFinder:
    """A meta-path finder for `matplotlib.pyplot` only: finds it with the other finders and
    wraps its loader. Nothing is imported until the script imports pyplot itself."""

    def find_spec(self, name, path=None, target=None):
        if name != "matplotlib.pyplot":
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            find_spec = getattr(finder, "find_spec", None)
            if find_spec is None:
                continue
            try:
                spec = find_spec(name, path, target)
            except Exception:  # noqa: BLE001
                continue
            if spec is None:
                continue
            loader = spec.loader
            if loader is not None and hasattr(loader, "exec_module"):
                spec.loader = _LoaderHook(loader)
            return spec
        return None


def _short(err):
    try:
        text = "%s: %s" % (type(err).__name__, err)
    except Exception:  # noqa: BLE001
        text = type(err).__name__
    return text[:300]


def _type_name(value):
    kind = type(value)
    module = getattr(kind, "__module__", "") or ""
    name = getattr(kind, "__qualname__", kind.__name__)
    if module in ("builtins", "__main__", ""):
        return name
    return "%s.%s" % (module, name)


def _plain(value, depth=0):
    """Whether `value` is plain JSON data (no float NaN/inf, string keys, bounded depth)."""
    if depth > 20:
        return False
    if value is None or isinstance(value, (bool, str)):
        return True
    if isinstance(value, int):
        return type(value) is int or type(value) is bool
    if isinstance(value, float):
        return type(value) is float and value == value and value not in (float("inf"), float("-inf"))
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
        if _plain(value):
            encoded = json.dumps(value, allow_nan=False)
            if len(encoded) <= JSON_MAX_CHARS:
                described["json"] = value
    except Exception:  # noqa: BLE001
        pass
    return described


def _capture_value_image(value):
    """A PIL image or a matplotlib figure as the last expression comes back as an image."""
    module = getattr(type(value), "__module__", "") or ""
    if module.startswith("PIL.") and hasattr(value, "save"):
        try:
            buffer = io.BytesIO()
            image = value
            if getattr(image, "mode", "RGB") not in ("1", "L", "LA", "P", "RGB", "RGBA"):
                image = image.convert("RGBA")
            image.save(buffer, format="PNG")
            _add_image(buffer.getvalue(), "result.png", "value")
        except Exception as err:  # noqa: BLE001
            _note("the PIL image could not be converted to PNG: %s" % _short(err))
    elif module.startswith("matplotlib.") and hasattr(value, "savefig"):
        _capture_figure(value, "value")
    elif module.startswith("matplotlib.") and hasattr(value, "get_figure"):
        try:
            figure = value.get_figure()
        except Exception:  # noqa: BLE001
            figure = None
        if figure is not None and hasattr(figure, "savefig"):
            _capture_figure(figure, "value")


def reset():
    """Forget the images, notes and figures of the previous run (a session runs many)."""
    global _images_bytes
    del _images[:]
    del _notes[:]
    del _captured_figures[:]
    _images_bytes = 0


# The runner's own snippet for `warm_up`: no output, nothing of the run's.
_WARM_UP = "_names = [str(n) for n in range(4)]\n{'names': _names, 'count': len(_names)}"
_WARM_UP_NAME = "<warm-up>"


def warm_up():
    """Take the execution path once on the runner's own snippet (no user code, no output),
    ahead of a run, where there is time to spare: in a fork server, once before it forks
    anything, then in each pre-forked child while it waits for its run.

    The first pass imports what the path imports lazily (the script's codec, `__future__`
    for a last expression): a run that has to import them pays ≈ 0.8 ms. In a forked child,
    a pass copies the pages the path writes (a fork shares its parent's memory copy-on-write,
    and reference counts are writes): taken before the run, the run copies almost none.
    Nothing stays: the run's lists are reset, the snippet's lines leave `linecache`, its
    namespace is dropped."""
    namespace = types.ModuleType("__main__").__dict__
    source = _WARM_UP.encode("utf-8").decode("utf-8-sig", errors="surrogateescape")
    record, _ = run_code(source, _WARM_UP_NAME, namespace)
    json.dumps(record, default=str)
    linecache.cache.pop(_WARM_UP_NAME, None)
    reset()


def install_pyplot_hook():
    """Make `plt.show()` capture figures once the code imports pyplot (see _PyplotFinder), or
    now if pyplot is loaded already (a fork server imported it ahead: runs imported it)."""
    pyplot = sys.modules.get("matplotlib.pyplot")
    if pyplot is not None:
        try:
            _patch_pyplot(pyplot)
        except Exception:  # noqa: BLE001
            pass
    if not any(isinstance(finder, _PyplotFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PyplotFinder())


def _user_traceback(tb):
    """Drop the runner's own frames from the head of a traceback."""
    runner = __file__
    while tb is not None and tb.tb_frame.f_code.co_filename == runner:
        tb = tb.tb_next
    return tb


def _describe_exception(err, compiling=False, filename=SCRIPT_NAME):
    tb = None if compiling else _user_traceback(err.__traceback__)
    try:
        err.__traceback__ = tb
    except Exception:  # noqa: BLE001
        pass
    if compiling:
        # As the interpreter reports a script that does not compile: no traceback header.
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


# Private references (keyword-only defaults, bound when this module is loaded, before any user
# code runs): in a session, a cell that replaces `builtins.exec`, `ast.parse`, `isinstance` or
# this module's functions does not change how later cells are run and reported. Code that
# tampers with these function objects themselves (their defaults, their code) still can: see
# SECURITY.md, S-04.
def _compile(
    source,
    filename=SCRIPT_NAME,
    *,
    _parse=ast.parse,
    _Expr=ast.Expr,
    _Expression=ast.Expression,
    _compile_builtin=compile,
    _isinstance=isinstance,
):
    """The script as (body code, last-expression code or None). Raises SyntaxError."""
    tree = _parse(source, filename, "exec")
    last = None
    if tree.body and _isinstance(tree.body[-1], _Expr):
        last = _Expression(tree.body.pop().value)
    body = _compile_builtin(tree, filename, "exec", dont_inherit=True)
    if last is None:
        return body, None
    future = 0
    import __future__

    for feature in __future__.all_feature_names:
        future |= getattr(__future__, feature).compiler_flag
    expression = _compile_builtin(last, filename, "eval", flags=body.co_flags & future, dont_inherit=True)
    return body, expression


def _exit_code(err, *, _isinstance=isinstance, _int=int, _bool=bool):
    """What the interpreter would exit with for this SystemExit (and what it prints)."""
    code = err.code
    if code is None:
        return 0
    if _isinstance(code, _int) and not _isinstance(code, _bool):
        return code & 0xFF if code >= 0 else code % 256
    try:
        sys.stderr.write("%s\n" % (code,))
    except Exception:  # noqa: BLE001
        pass
    return 1


def _flush():
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # noqa: BLE001
            pass


def run_code(
    source,
    filename,
    namespace,
    close_figures=False,
    *,
    _exec=exec,
    _eval=eval,
    _SystemExit=SystemExit,
    _BaseException=BaseException,
    _compile=_compile,
    _exit_code=_exit_code,
    _describe_exception=_describe_exception,
    _describe_value=_describe_value,
    _reset=reset,
    _list=list,
    _str=str,
):
    """Run `source` in `namespace` as a notebook cell (the execution core of both runners).

    Returns (record, value): the record's fields (value, names, exception, exit_code, images,
    notes) and the last expression's value (None when there is none). An exception or
    `sys.exit()` ends the code, not the caller. Open matplotlib figures are captured at the
    end, and closed when `close_figures` (a session's next cell must not show them again).
    """
    _reset()
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    record = {"version": RECORD_VERSION, "value": None, "names": [], "exception": None}
    exit_code = 0
    value = None
    compiling = True
    try:
        body, expression = _compile(source, filename)
        compiling = False
        _exec(body, namespace)
        if expression is not None:
            value = _eval(expression, namespace)
            if value is not None:
                record["value"] = _describe_value(value)
                _capture_value_image(value)
    except _SystemExit as err:
        exit_code = _exit_code(err)
    except _BaseException as err:  # noqa: BLE001 - report everything the code raised
        exit_code = 1
        text, record["exception"] = _describe_exception(err, compiling, filename)
        _flush()
        try:
            # The interpreter's own report (or the code's sys.excepthook), without the
            # runner's frames. The default hook cannot show the lines of code that is not in
            # a file (a session's `<cell N>`): our own formatting has them.
            if filename.startswith("<") and sys.excepthook is sys.__excepthook__:
                sys.stderr.write(text)
            else:
                sys.excepthook(type(err), err, err.__traceback__)
        except Exception:  # noqa: BLE001
            try:
                sys.stderr.write(text)
            except Exception:  # noqa: BLE001
                pass
    _flush()
    _capture_open_figures(close=close_figures)
    names = [name for name in _list(namespace) if not (name.startswith("__") and name.endswith("__"))]
    record["names"] = [_str(name)[:200] for name in names[:MAX_NAMES]]
    record["exit_code"] = exit_code
    record["images"] = _list(_images)
    record["notes"] = _list(_notes)
    return record, value


def _is_script(filename):
    return filename == SCRIPT_NAME


def install_import_policy(directory, own=_is_script):
    """Install the import guard when `directory` holds an import policy (`imports.json`):
    the run's own code is that of the files `own` accepts (script.py; a session's cells)."""
    policy_path = os.path.join(directory, IMPORT_POLICY_FILE)
    if os.path.exists(policy_path):
        with open(policy_path, "rb") as handle:
            _install_import_policy(json.loads(handle.read().decode("utf-8"))["allowed"], own)


def take_blocked(record):
    """Move the imports and programs blocked so far into `record` (a session's cell's)."""
    record["blocked_imports"] = list(_blocked)
    record["blocked_exec"] = list(_blocked_exec)
    del _blocked[:]
    del _blocked_exec[:]


def _install_import_policy(allowed, own=_is_script):
    """The import guard of `allowed_imports`: an import that the script's own code makes (an
    `import` statement, `__import__` or `importlib.import_module`, anywhere in script.py, or
    in a session's cells) of a module that no allowed name covers raises ImportError and is
    reported. Imports that libraries make for themselves are not checked. A guard rail for
    code that plays by the rules, not a boundary: the sandbox is that.
    """
    import builtins
    import importlib

    allowed = tuple(str(name) for name in allowed)

    def check(name, depth):
        try:
            frame = sys._getframe(depth)
        except ValueError:
            return
        if not own(frame.f_code.co_filename):
            return
        name = str(name)
        if any(name == entry or name.startswith(entry + ".") for entry in allowed):
            return
        if len(_blocked) < MAX_BLOCKED:
            _blocked.append({"module": name, "line": frame.f_lineno})
        raise ImportError(
            "import of %r is blocked: it is outside the import policy (allowed: %s)" % (name, ", ".join(allowed) or "none"),
            name=name,
        )

    original_import = builtins.__import__
    original_import_module = importlib.import_module

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level == 0:
            check(name, 2)
        return original_import(name, globals, locals, fromlist, level)

    def guarded_import_module(name, package=None):
        if not str(name).startswith("."):
            check(name, 2)
        return original_import_module(name, package)

    builtins.__import__ = guarded_import
    importlib.import_module = guarded_import_module


def _wait_for_request():
    """Warm pool: block until the engine's one request arrives on stdin (a private pipe).

    The engine writes the script into the input directory, then sends "go". Afterwards stdin
    is /dev/null, as in a run that was not pre-started. False when the engine went away.
    """
    request = b""
    while not request.endswith(b"\n"):
        try:
            chunk = os.read(0, 64)
        except InterruptedError:
            continue
        except OSError:
            return False
        if not chunk:
            return False
        request += chunk
    try:
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.close(null)
    except OSError:
        os.close(0)
    return request == b"go\n"


SECRETS_FILE = "secrets.json"
# The variables the usual clients read a trust bundle from: Python's ssl (and httpx, urllib3,
# pip), requests (which otherwise reads certifi's), curl, git, node.
_CA_VARIABLES = ("SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "GIT_SSL_CAINFO", "NODE_EXTRA_CA_CERTS")


def install_secrets(directory):
    """A run granted the operator's secrets: each name's environment variable holds the run's
    placeholder (never the value, which only the server's proxy holds and puts into requests
    to the secret's hosts), and the clients trust the bundle that adds the proxy's CA."""
    path = os.path.join(directory, SECRETS_FILE)
    if not os.path.exists(path):
        return
    with open(path, "rb") as handle:
        granted = json.loads(handle.read().decode("utf-8"))
    for name, placeholder in granted["env"].items():
        os.environ[name] = placeholder
    for name in _CA_VARIABLES:
        os.environ[name] = granted["ca_bundle"]


BRIDGE_PORT = 3128
_BRIDGE_BUFFER = 1 << 20


def start_bridge(socket_path, port=BRIDGE_PORT):
    """Network policy `on` or `allow:`: the run's one way out.

    The run keeps its own network namespace (loopback only). This listens on
    127.0.0.1:`port` and forwards each connection, byte for byte, to the server's proxy at
    `socket_path` (a Unix socket in the run's input directory), which decides and logs every
    destination. It runs before any user code, in a child process that holds nothing but
    its two sockets, and ends when this process ends (its lifeline pipe closes). The proxy
    variables (HTTP_PROXY, HTTPS_PROXY, ALL_PROXY) point here.
    """
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(128)
    lifeline_r, lifeline_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(lifeline_r)
        listener.close()
        _keep.append(lifeline_w)
        url = "http://127.0.0.1:%d" % port
        for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"):
            os.environ[name] = url
            os.environ[name.lower()] = url
        os.environ["NO_PROXY"] = os.environ["no_proxy"] = ""
        return
    code = 0
    try:
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        keep = {0, 1, 2, listener.fileno(), lifeline_r}
        try:
            open_fds = [int(name) for name in os.listdir("/proc/self/fd")]
        except OSError:
            open_fds = list(range(3, 1024))
        for fd in open_fds:
            if fd not in keep:
                try:
                    os.close(fd)
                except OSError:
                    pass
        _bridge_serve(listener, socket_path, lifeline_r)
    except BaseException:  # noqa: BLE001 - the bridge ends; the run sees connections refused
        code = 1
    os._exit(code)


class _Side:
    __slots__ = ("sock", "peer", "out", "eof", "events")

    def __init__(self, sock):
        self.sock = sock
        self.peer = None
        self.out = bytearray()
        self.eof = False
        self.events = 0


def _bridge_serve(listener, socket_path, lifeline):
    import selectors
    import socket

    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(lifeline, selectors.EVENT_READ, "lifeline")

    def close(side):
        for one in (side, side.peer):
            if one.events:
                selector.unregister(one.sock)
                one.events = 0
            one.sock.close()

    def update(side):
        events = 0
        if not side.eof and len(side.peer.out) < _BRIDGE_BUFFER:
            events |= selectors.EVENT_READ
        if side.out:
            events |= selectors.EVENT_WRITE
        if events == side.events:
            return
        if side.events and events:
            selector.modify(side.sock, events, side)
        elif events:
            selector.register(side.sock, events, side)
        else:
            selector.unregister(side.sock)
        side.events = events

    while True:
        for key, mask in selector.select():
            if key.data == "lifeline":
                return
            if key.data == "accept":
                try:
                    client, _ = listener.accept()
                except OSError:
                    continue
                upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                try:
                    upstream.connect(socket_path)
                except OSError:
                    client.close()
                    upstream.close()
                    continue
                client.setblocking(False)
                upstream.setblocking(False)
                a, b = _Side(client), _Side(upstream)
                a.peer, b.peer = b, a
                update(a)
                update(b)
                continue
            side = key.data
            if side.events == 0:
                continue
            try:
                if mask & selectors.EVENT_READ and not side.eof:
                    data = side.sock.recv(65536)
                    if data:
                        side.peer.out += data
                    else:
                        side.eof = True
                        if not side.peer.out:
                            side.peer.sock.shutdown(socket.SHUT_WR)
                if mask & selectors.EVENT_WRITE and side.out:
                    sent = side.sock.send(side.out)
                    del side.out[:sent]
                    if not side.out and side.peer.eof:
                        side.sock.shutdown(socket.SHUT_WR)
            except (BlockingIOError, InterruptedError):
                pass
            except OSError:
                close(side)
                continue
            if side.eof and side.peer.eof and not side.out and not side.peer.out:
                close(side)
                continue
            update(side)
            update(side.peer)


END_REPORT_TAG = b"\x1esnakebox-end "
# Signals a reaper ignores: code in the run that signals its whole process group must not end
# the reaper before it reported (SIGKILL cannot be ignored; then no report comes, and a status
# of 129-192 is read as a death by signal, as it was before reapers).
_REAPER_IGNORES = ("SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGPIPE")


def report_end_from_parent(control_fd):
    """Fork once; the child returns and runs everything, this process reaps it and reports.

    bubblewrap reports a death by signal N as exit status 128 + N, so the host cannot tell
    `os._exit(137)` from a SIGKILL. This process (the runner's parent in the sandbox) sees the
    child's true wait status: it writes it as the last line of the control channel
    (`END_REPORT_TAG` + `exited N` / `signaled N`), then ends the same way (the same exit code,
    or the same signal), so the host's own view agrees with the report. It runs no user code,
    holds nothing but the control channel, and costs one small idle process.

    Where the sandbox makes it pid 1 of its PID namespace (the native backend does), the
    kernel drops every signal the run sends it, `kill(-1)` and SIGKILL included, so the run
    cannot end it before it reports; it then also reaps every process the run orphans, and
    its own end (as init's) ends the rest of the run, as bubblewrap's init did.
    """
    try:
        import signal

        pid = os.fork()
    except (OSError, ImportError):
        return  # without a report, 129-192 stays ambiguous (read as signals); nothing else changes
    if pid == 0:
        return
    try:
        for name in _REAPER_IGNORES:
            signal.signal(getattr(signal, name), signal.SIG_IGN)
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        os.close(null)
    except (OSError, ValueError, AttributeError):
        pass
    # As init, every orphan of the run is this process's child: reap them all until the
    # runner's own status comes.
    wanted = -1 if os.getpid() == 1 else pid
    while True:
        try:
            ended, status = os.waitpid(wanted, 0)
        except InterruptedError:
            continue
        except OSError:
            os._exit(255)
        if ended == pid:
            break
    if os.WIFSIGNALED(status):
        kind, number = "signaled", os.WTERMSIG(status)
    else:
        kind, number = "exited", os.WEXITSTATUS(status)
    try:
        os.write(control_fd, END_REPORT_TAG + ("%s %d\n" % (kind, number)).encode("ascii"))
    except OSError:
        pass
    if kind == "signaled":
        try:
            signal.signal(number, signal.SIG_DFL)
        except (OSError, ValueError):
            pass
        try:
            os.kill(os.getpid(), number)
        except OSError:
            pass
        os._exit(128 + number)
    os._exit(number)


# Programs the script tried to start under a profile that denies subprocesses.
_blocked_exec = []
# Audit events (PEP 578) of starting a program, and where each names it.
_EXEC_EVENTS = {"os.exec": 0, "os.posix_spawn": 0, "os.spawn": 1, "os.system": 0, "subprocess.Popen": 0}


def _deny_exec(program_path):
    """The second stage of a run's seccomp programs, for a profile without subprocesses:
    load the program at `program_path` (execve and execveat return EPERM) into this process
    before any user or environment code. No other thread exists yet (the proxy bridge starts
    after), and every later process inherits it. Fails closed: a program that cannot be
    installed ends the run before the script. An audit hook notes each attempt for the
    result's events (a report only; the kernel does the refusing)."""
    import ctypes

    with open(program_path, "rb") as handle:
        code = handle.read()
    if not code or len(code) % 8:
        raise SystemExit("snakebox: the exec-deny program is malformed")
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]

    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buffer = ctypes.create_string_buffer(code, len(code))
    program = Fprog(len(code) // 8, ctypes.addressof(buffer))
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or libc.prctl(
        PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.addressof(program), 0, 0
    ) != 0:
        raise SystemExit("snakebox: could not deny subprocesses (errno %d)" % ctypes.get_errno())

    def hook(event, args, _events=_EXEC_EVENTS, _blocked=_blocked_exec, _str=str, _len=len):
        where = _events.get(event)
        if where is not None and _len(_blocked) < 20:
            try:
                program = _str(args[where])[:200]
                # subprocess raises its own event and then os.posix_spawn's: one attempt.
                if not _blocked or _blocked[-1] != program:
                    _blocked.append(program)
            except Exception:  # noqa: BLE001
                pass

    sys.addaudithook(hook)


def _imported_since(before):
    """The modules the run imported that were not in `before`, as few as name them all: those
    whose package was loaded already (`scipy.stats`, not the `scipy.stats.*` it brings), and
    public ones only (a private module comes with its public importer). In the order their
    imports started (`sys.modules` keeps it: a module is entered as its import begins), so
    what the script imported itself comes before what that imported. At most MAX_IMPORTED."""
    try:
        new = [name for name in list(sys.modules) if isinstance(name, str) and name not in before]
    except Exception:  # noqa: BLE001 - a script may have replaced sys.modules
        return []
    fresh = set(new)
    prefixes = tuple({os.path.join(p, "") for p in (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)})
    return [
        name
        for name in new
        if name.rpartition(".")[0] not in fresh
        and not any(part.startswith("_") for part in name.split("."))
        and _of_the_environment(sys.modules.get(name), prefixes)
    ][:MAX_IMPORTED]


def _of_the_environment(module, prefixes):
    """Whether `module` was loaded from the interpreter or the environment (built in, or its
    files under `prefixes`: the interpreter's and the environment's), not from the run's own
    files (its working directory, /tmp): a fork server could not import those, nor should it
    import an environment's module of the same name in their place."""
    paths = []
    try:
        location = getattr(module, "__file__", None)
        if isinstance(location, str):
            paths.append(location)
        paths.extend(str(entry) for entry in getattr(module, "__path__", None) or ())
    except Exception:  # noqa: BLE001 - a module object of the script's making
        return False
    return all(path.startswith(prefixes) for path in paths)


def confine(options):
    """The first thing a runner does (one-shot or session): with `--deny-exec PATH`, install
    the exec-deny program before the environment's site code (`--site`), the bridge and any
    user code."""
    if "--deny-exec" in options:
        _deny_exec(options[options.index("--deny-exec") + 1])
    if "--site" in options:
        # Started with -S so that the environment's .pth files run only now, under the
        # program above.
        import site

        site.main()


def main():
    script_path = sys.argv[1]
    control_fd = int(sys.argv[2])
    options = sys.argv[3:]
    confine(options)
    # Move the private pipe out of the way: the script sees nothing on fd 3, and a file the
    # script opens cannot land on the descriptor we write the record to.
    try:
        import fcntl

        private = fcntl.fcntl(control_fd, fcntl.F_DUPFD_CLOEXEC, 200)
        os.close(control_fd)
    except OSError:
        private = None

    if "--proxy" in options:
        # Before any user code: the run's way out (see `start_bridge`).
        start_bridge(options[options.index("--proxy") + 1])
    if "--wait" in options and not _wait_for_request():
        return 0
    if "--proxy" in options:
        # After the request (a pre-started runner learns its run only now), before any user
        # code: the run's secrets, as placeholders (see `install_secrets`).
        install_secrets(os.path.dirname(script_path))

    # With --report-imports (a forked run of an environment with packages), the modules the
    # run imports are reported: the server may have its fork server import them ahead.
    before = set(sys.modules) if "--report-imports" in options else None
    with open(script_path, "rb") as handle:
        raw = handle.read()
    install_import_policy(os.path.dirname(script_path))
    source = raw.decode("utf-8-sig", errors="surrogateescape")

    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(
        {
            "__file__": script_path,
            "__builtins__": __builtins__,
            "__spec__": None,
            "__loader__": None,
            "__cached__": None,
        }
    )
    # Keep the runner's own module alive: its functions still use its globals.
    _keep.append(sys.modules["__main__"])
    sys.modules["__main__"] = main_module
    sys.argv = [script_path]
    # As in a notebook, modules in the working directory (input files such as helpers.py)
    # are importable; the script's own directory stays first, as with `python script.py`.
    try:
        cwd = os.getcwd()
        if cwd not in sys.path:
            sys.path.insert(1, cwd)
    except OSError:
        pass
    namespace = main_module.__dict__
    install_pyplot_hook()

    record = {"version": RECORD_VERSION, "value": None, "names": [], "exception": None}
    exit_code = 0
    try:
        # Tracebacks and inspect find the script's lines under its short name.
        record, _ = run_code(source, SCRIPT_NAME, namespace)
        exit_code = record["exit_code"]
        if "result" in namespace:
            try:
                record["result_variable"] = _describe_value(namespace["result"])
            except Exception:  # noqa: BLE001 - a value that cannot be described is left out
                pass
    finally:
        record["blocked_imports"] = list(_blocked)
        record["blocked_exec"] = list(_blocked_exec)
        if before is not None:
            record["imported"] = _imported_since(before)
        _flush()
        if private is not None:
            try:
                payload = ("\n" + json.dumps(record, default=str) + "\n").encode("utf-8", "replace")
                view = memoryview(payload)
                while view:
                    written = os.write(private, view)
                    view = view[written:]
            except Exception:  # noqa: BLE001 - a closed or full pipe only loses the record
                pass
            try:
                os.close(private)
            except OSError:
                pass
    return exit_code


if __name__ == "__main__":
    report_end_from_parent(int(sys.argv[2]))
    sys.exit(main())
