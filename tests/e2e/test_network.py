"""Network policy (issue 13): off by default; a call asking for network on a server that does not
allow it is refused with the reason; with `on` or `allow:`, runs keep their own network namespace
and reach out only through the server's per-run proxy, whose every decision is in `network_log`.

The test hosts live in a network namespace these tests create (a veth pair, 198.51.100.0/24, a
documentation range): dnsmasq answers the test names, small Python listeners serve and record.
Only those addresses are ever contacted; the private and loopback addresses below are ones the
proxy must refuse before connecting anywhere."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from backend_support import FORK_SERVER_ONLY
from conftest import call, connect
from netns_support import make_certificates, make_namespace, remove_namespace

pytestmark = pytest.mark.anyio

INTERFACES = "import json, socket\nprint(json.dumps(sorted(name for _, name in socket.if_nameindex())))\n"


def host_interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


async def test_the_narrowing_arguments_have_plain_schemas(client):
    """`allowed_domains` is a plain list of strings, optional as every optional argument is:
    nullable (no oneOf/$ref: some model APIs reject them; see crates/snakebox-server/src/schemas.rs)."""
    import json

    tools = {tool.name: tool for tool in (await client.list_tools()).tools}
    for name in ("execute_python", "create_session"):
        schema = tools[name].input_schema["properties"]["allowed_domains"]
        assert schema["anyOf"] == [{"type": "array", "items": {"type": "string"}}, {"type": "null"}], schema
        assert "allowed_domains" not in tools[name].input_schema.get("required", [])
        text = json.dumps(schema)
        assert "oneOf" not in text and "$ref" not in text, text


async def test_a_run_that_looks_a_name_up_without_network_is_told_why_and_who_can_change_it(client):
    """Issue 36: on a server without network (the default), a run that tries to resolve a host
    gets a note naming the setting that enables it, not a bare DNS error; a run that does not
    try gets no such note."""
    data, text, _ = await call(client, "execute_python", script="import socket\nsocket.getaddrinfo('example.com', 443)\n")
    assert data["status"] == "error" and data["exception"]["type_name"].endswith("gaierror"), text
    notes = [note for note in data["notes"] if "host names do not resolve" in note]
    assert len(notes) == 1 and "--network on" in notes[0], data["notes"]
    assert "note: This server runs code without network" in text
    data, text, _ = await call(client, "execute_python", script="raise RuntimeError('offline?')")
    assert not any("host names do not resolve" in note for note in data["notes"]), data["notes"]


LOOKUP = "import socket\nsocket.getaddrinfo('example.com', 443)\n"


def offline_notes(data: dict) -> list[str]:
    return [note for note in data["notes"] or [] if "host names do not resolve" in note]


async def test_a_sessions_cells_and_commands_that_look_a_name_up_are_told_why_and_who_can_change_it(snakebox_bin: Path, tmp_path: Path):
    """Issue 36: a session's cell or command without network that tries to resolve a host gets
    the note too, in a session's words: the operator's `--network` on a server without network;
    on a server with network, a session created with `network: false` is told to create one
    without it. A cell that does not try gets none."""
    async with connect(snakebox_bin, tmp_path / "off", "auto") as client:
        session, text, _ = await call(client, "create_session")
        sid = session["session_id"]
        data, text, _ = await call(client, "execute_python", script=LOOKUP, session_id=sid)
        assert data["status"] == "error", text
        notes = offline_notes(data)
        assert len(notes) == 1 and notes[0].startswith(f"Session {sid} has no network: this server runs code without network"), data["notes"]
        assert "--network on" in notes[0]
        command, text, _ = await call(client, "run_command", session_id=sid, command=f"python -c \"{LOOKUP.strip()}\"".replace("\n", "; "))
        assert command["status"] == "error", text
        assert len(offline_notes(command)) == 1, command
        quiet, text, _ = await call(client, "execute_python", script="x = 1", session_id=sid)
        assert offline_notes(quiet) == [], quiet["notes"]

    async with connect(snakebox_bin, tmp_path / "on", "auto", "--network", "on") as client:
        session, text, _ = await call(client, "create_session", network=False)
        sid = session["session_id"]
        data, text, _ = await call(client, "execute_python", script=LOOKUP, session_id=sid)
        notes = offline_notes(data)
        assert len(notes) == 1 and "created without (`network: false` at create_session)" in notes[0], data["notes"]
        assert "create a new session without it" in notes[0]


async def test_asking_for_network_on_a_server_without_it_is_refused(client):
    data, text, is_error = await call(client, "execute_python", script="print('never runs')", network=True)
    assert is_error and data["status"] == "invalid_request"
    assert "network" in data["error"]["message"]
    assert "--network on" in data["error"]["hint"]
    assert data["stdout"] == ""
    # Proof of life: the same call without the request runs, with loopback only.
    data, _, _ = await call(client, "execute_python", script=INTERFACES)
    assert data["status"] == "ok"
    assert data["stdout"].strip() == '["lo"]'



NS = f"snbt-{os.getpid()}"
HOST_SIDE, NS_SIDE = f"snbh{os.getpid() % 100000}", f"snbn{os.getpid() % 100000}"
DNS, WEB, REBIND_DNS = "198.51.100.2", "198.51.100.3", "198.51.100.4"
# The package host: a simple index on PKGS:8000 whose pages link the wheels on PKGS:80 (another
# destination for the install proxy), and FAR:80; one server that records each request's Host.
# Installs resolve names with the host's resolver (not the test name server), so these are
# addresses.
PKGS, FAR = "198.51.100.5", "198.51.100.6"

# A name server that answers each name below `rebind.test` with the test host first and with
# loopback after (DNS rebinding); every other query gets an empty answer.
REBINDER = textwrap.dedent("""
    import socket, struct, sys
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind((sys.argv[1], 53))
    print("ready", flush=True)
    answered = {}
    while True:
        query, peer = s.recvfrom(512)
        ident, flags, qd = struct.unpack(">HHH", query[:6])
        i, labels = 12, []
        while query[i]:
            labels.append(query[i + 1 : i + 1 + query[i]].decode().lower())
            i += 1 + query[i]
        qtype = struct.unpack(">H", query[i + 1 : i + 3])[0]
        question = query[12 : i + 5]
        answers = b""
        name = ".".join(labels)
        if name.endswith(".rebind.test") and qtype == 1:
            address = sys.argv[2] if name not in answered else "127.0.0.1"
            answered[name] = True
            answers = bytes([0xC0, 0x0C]) + struct.pack(">HHIH", 1, 1, 0, 4) + socket.inet_aton(address)
        head = struct.pack(">HHHHHH", ident, 0x8180, 1, 1 if answers else 0, 0, 0)
        s.sendto(head + question + answers, peer)
""")

# A listener on each port: records every connection it accepts in `<dir>/<port>.log`; port 80
# answers HTTP with a marker.
HOSTS = textwrap.dedent("""
    import socket, sys, threading
    import ssl
    log_dir = sys.argv[1]
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(f"{log_dir}/host.pem", f"{log_dir}/host.key")
    def serve(port):
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind((sys.argv[2], port))
        s.listen(16)
        while True:
            c, peer = s.accept()
            with open(f"{log_dir}/{port}.log", "a") as f:
                f.write(f"{peer[0]}\\n")
            if port == 443:
                try:
                    c.settimeout(10)
                    c = tls.wrap_socket(c, server_side=True)
                    c.recv(65536)
                    body = b"hello over TLS from the allowed test host"
                    c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Length: %d\\r\\n\\r\\n" % len(body) + body)
                except OSError:
                    pass
            if port == 80:
                request = c.recv(65536)
                body = b"hello from the allowed test host"
                kind = b"text/plain"
                if request.startswith(b"GET /simple/snbtpkg/"):
                    body = b'<a href="/files/snbtpkg-1.0-py3-none-any.whl">snbtpkg-1.0-py3-none-any.whl</a>'
                    kind = b"text/html"
                elif request.startswith(b"GET /files/snbtpkg-1.0-py3-none-any.whl"):
                    body = open(f"{log_dir}/snbtpkg-1.0-py3-none-any.whl", "rb").read()
                if b"X-Echo-Host" in request:
                    body = [l for l in request.split(b"\\r\\n") if l.lower().startswith(b"host:")][0][5:].strip()
                c.sendall(b"HTTP/1.0 200 OK\\r\\nContent-Type: %s\\r\\nContent-Length: %d\\r\\n\\r\\n" % (kind, len(body)) + body)
            c.close()
    for port in (80, 443, 8080):
        threading.Thread(target=serve, args=(port,), daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
""")




def make_wheel(path: Path, name: str = "snbtpkg", value: str = "from the local index") -> None:
    """A one-module wheel for the test index (pure Python, py3-none-any)."""
    import base64
    import hashlib
    import zipfile

    files = {
        f"{name}/__init__.py": f"VALUE = {value!r}\n".encode(),
        f"{name}-1.0.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n".encode(),
        f"{name}-1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: snakebox-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = ""
    for member, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record += f"{member},sha256={digest},{len(data)}\n"
    record += f"{name}-1.0.dist-info/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as wheel:
        for member, data in files.items():
            wheel.writestr(member, data)
        wheel.writestr(f"{name}-1.0.dist-info/RECORD", record)


# The package host: `/simple/<name>/` links `http://<argv[2]>/files/<wheel>`; `/files/<wheel>`
# serves the wheels in the log directory; every request's Host is appended to `pkgs.log`.
PACKAGE_HOST = textwrap.dedent("""
    import hashlib, http.server, os, sys
    log_dir = sys.argv[1]
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass
        def do_HEAD(self):
            self.do_GET(head=True)
        def do_GET(self, head=False):
            with open(f"{log_dir}/pkgs.log", "a") as f:
                f.write(f"{self.headers.get('Host', '')} {self.path}\\n")
            parts = [p for p in self.path.split("?")[0].split("/") if p]
            wheels = {n: n for n in os.listdir(log_dir) if n.endswith(".whl")}
            if len(parts) == 2 and parts[0] == "simple":
                links = [f'<a href="http://{sys.argv[2]}/files/{n}#sha256={hashlib.sha256(open(f"{log_dir}/{n}", "rb").read()).hexdigest()}">{n}</a>'
                         for n in wheels if n.split("-")[0] == parts[1]]
                body, kind = ("<html><body>" + "".join(links) + "</body></html>").encode(), "text/html"
            elif len(parts) == 2 and parts[0] == "files" and parts[1] in wheels:
                body, kind = open(f"{log_dir}/{parts[1]}", "rb").read(), "application/octet-stream"
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
    import threading
    for address, port in [(sys.argv[2], 80), (sys.argv[2], 8000), (sys.argv[3], 80)]:
        server = http.server.ThreadingHTTPServer((address, port), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
""")


@pytest.fixture(scope="module")
def test_hosts(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("dnsmasq"):
        pytest.skip("needs root, iproute2 and dnsmasq (scripts/install-deps installs them)")
    logs = tmp_path_factory.mktemp("test-hosts")
    logs.chmod(0o777)
    processes: list[subprocess.Popen] = []
    try:
        inside = make_namespace(NS, HOST_SIDE, NS_SIDE, "198.51.100.1/24",
                                [f"{address}/24" for address in (DNS, WEB, REBIND_DNS, PKGS, FAR)])
        processes.append(subprocess.Popen(
            [*inside, "dnsmasq", "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces",
             f"--listen-address={DNS}", "--port=53",
             f"--address=/allowed.test/{WEB}", f"--address=/other.test/{WEB}",
             "--address=/loop.test/127.0.0.1", "--address=/meta.test/169.254.169.254",
             "--address=/private.test/10.1.2.3", "--address=/mapped.test/::ffff:127.0.0.1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        make_wheel(logs / "snbtpkg-1.0-py3-none-any.whl")
        make_wheel(logs / "snbtfar-1.0-py3-none-any.whl", "snbtfar", "from the files host")
        make_certificates(logs, ["allowed.test"], "snakebox test CA")
        packages = subprocess.Popen([*inside, sys.executable, "-c", PACKAGE_HOST, str(logs), PKGS, FAR],
                                    stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        processes.append(packages)
        assert packages.stdout is not None and packages.stdout.readline().strip() == "ready"
        hosts = subprocess.Popen([*inside, sys.executable, "-c", HOSTS, str(logs), WEB],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        processes.append(hosts)
        assert hosts.stdout is not None and hosts.stdout.readline().strip() == "ready"
        rebinder = subprocess.Popen([*inside, sys.executable, "-c", REBINDER, REBIND_DNS, WEB],
                                    stdout=subprocess.PIPE, text=True)
        processes.append(rebinder)
        assert rebinder.stdout is not None and rebinder.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # dnsmasq binds
        yield logs
    finally:
        for process in processes:
            process.kill()
            process.wait()
        remove_namespace(NS, HOST_SIDE)


def connections(logs: Path, port: int) -> int:
    path = logs / f"{port}.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


class LoopbackListener:
    """A listener on the host's 127.0.0.1 that records every connection it accepts."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            conn.close()


FETCH = """
import json, os, socket, urllib.request
def fetch(url):
    try:
        return urllib.request.urlopen(url, timeout=20).read().decode()
    except Exception as err:
        return "failed: " + type(err).__name__ + ": " + str(err)[:200]
out = {"interfaces": sorted(n for _, n in socket.if_nameindex()), "proxy": os.environ.get("HTTPS_PROXY")}
"""


def server_args(*policy: str) -> list[str]:
    return ["--network", *policy, "--network-resolvers", DNS]


@pytest.mark.docker_ci
async def test_on_reaches_an_allowed_name_but_never_the_hosts_loopback(snakebox_bin, data_dir, mode, test_hosts):
    listener = LoopbackListener()
    port = listener.port
    script = FETCH + f"""
out["allowed"] = fetch("http://allowed.test/")
for name, url in [("literal", "http://127.0.0.1:{port}/"), ("localhost", "http://localhost:{port}/"),
                  ("short", "http://127.1:{port}/"), ("hex", "http://0x7f000001:{port}/"),
                  ("decimal", "http://2130706433/"), ("mapped_literal", "http://[::ffff:127.0.0.1]:{port}/"),
                  ("loop_name", "http://loop.test/"), ("metadata", "http://meta.test/"),
                  ("private", "http://private.test/"), ("mapped_name", "http://mapped.test/"),
                  ("port", "http://allowed.test:8080/")]:
    out[name] = fetch(url)
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("127.0.0.1", {port}))
    out["direct"] = "connected"
except OSError as err:
    out["direct"] = "refused: " + str(err)
print(json.dumps(out))
"""
    async with connect(snakebox_bin, data_dir, mode, *server_args("on")) as client:
        data, text, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        import json

        out = json.loads(data["stdout"])
        # Its own network namespace, and the proxy variables set by snakebox.
        assert out["interfaces"] == ["lo"]
        assert out["proxy"] == "http://127.0.0.1:3128"
        # Proof of life: the allowed name is reachable through the proxy.
        assert out["allowed"] == "hello from the allowed test host", out
        for name in ("literal", "localhost", "short", "hex", "decimal", "mapped_literal", "loop_name",
                     "metadata", "private", "mapped_name", "port", "direct"):
            assert out[name].startswith(("failed", "refused")), (name, out[name])
        log = data["network_log"]
        allowed = [e for e in log if e["allowed"]]
        assert [(e["host"], e["port"]) for e in allowed] == [("allowed.test", 80)], log
        assert allowed[0]["bytes_received"] > 0 and allowed[0]["address"] == f"{WEB}:80"
        reasons = {(e["host"], e["port"]): e["reason"] for e in log if not e["allowed"]}
        assert "IP address" in reasons[("127.0.0.1", port)]
        assert "IP address" in reasons[("127.1", port)]
        assert "IP address" in reasons[("0x7f000001", port)]
        assert "IP address" in reasons[("2130706433", 80)]
        assert "IP address" in reasons[("::ffff:127.0.0.1", port)]
        assert "loopback" in reasons[("loop.test", 80)]
        assert "metadata" in reasons[("meta.test", 80)]
        assert "RFC 1918" in reasons[("private.test", 80)]
        assert "IPv4-mapped" in reasons[("mapped.test", 80)] or "loopback" in reasons[("mapped.test", 80)]
        assert "port 8080 is not allowed" in reasons[("allowed.test", 8080)]
        # Each refusal is a security event of the run too, with its reason.
        denied = [e["detail"] for e in data["events"] if e["kind"] == "network_denied"]
        assert len(denied) == len(reasons), data["events"]
        assert "allowed.test:8080: " + reasons[("allowed.test", 8080)] in denied
        assert "blocked by policy" in text and "allowed allowed.test:80" in text
        report, _, _ = await call(client, "check_environment")
        assert report["network_policy"] == "on"
        assert "own network namespace" in report["network_enforcement"]
    # Judged from outside: the host's loopback listener saw nothing, the test host's port 8080
    # neither; the allowed host saw the run.
    assert listener.accepted == 0
    assert connections(test_hosts, 8080) == 0
    assert connections(test_hosts, 80) >= 1


async def test_allow_lists_narrowing_and_sni(snakebox_bin, data_dir, mode, test_hosts):
    before_443 = connections(test_hosts, 443)
    script = FETCH + """
out["allowed"] = fetch("http://allowed.test/")
out["other"] = fetch("http://other.test/")
import ssl
ctx = ssl.create_default_context()
ctx.check_hostname = False
ctx.verify_mode = ssl.CERT_NONE
for name, sni in [("sni_mismatch", "other.test"), ("sni_missing", None), ("sni_match", "allowed.test")]:
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(b"CONNECT allowed.test:443 HTTP/1.1\\r\\nHost: allowed.test:443\\r\\n\\r\\n")
    head = s.recv(4096)
    try:
        ctx.wrap_socket(s, server_hostname=sni).close()
        out[name] = "handshake done"
    except (OSError, ssl.SSLError) as err:
        out[name] = "failed: " + type(err).__name__
print(json.dumps(out))
"""
    import json

    async with connect(snakebox_bin, data_dir, mode, *server_args("allow:allowed.test,*.sub.test")) as client:
        data, _, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        out = json.loads(data["stdout"])
        assert out["allowed"] == "hello from the allowed test host", out
        assert out["other"].startswith("failed"), out
        assert out["sni_mismatch"].startswith("failed") and out["sni_missing"].startswith("failed"), out
        reasons = [e["reason"] for e in data["network_log"] if not e["allowed"]]
        assert any("`other.test` is not in this run's allowlist" in r for r in reasons), reasons
        assert any("TLS server name `other.test` differs" in r for r in reasons), reasons
        assert any("SNI missing" in r for r in reasons), reasons
        # The matching server name passes: the proxy connected to the test host's port 443
        # (a plain listener there ends the handshake, so the client sees a failure).
        matched = [e for e in data["network_log"] if e["allowed"] and e["port"] == 443]
        assert [e["host"] for e in matched] == ["allowed.test"], data["network_log"]
        # A call may narrow the policy, never widen it.
        narrowed, _, _ = await call(client, "execute_python", script=FETCH + 'out["allowed"] = fetch("http://allowed.test/")\nprint(json.dumps(out))\n',
                                    allowed_domains=["x.sub.test"])
        assert narrowed["status"] == "ok", narrowed
        assert json.loads(narrowed["stdout"])["allowed"].startswith("failed")
        assert "allowlist" in narrowed["network_log"][0]["reason"]
        wider, _, is_error = await call(client, "execute_python", script="print(1)", allowed_domains=["other.test"])
        assert is_error and wider["status"] == "invalid_request"
        assert "does not allow" in wider["error"]["message"] and wider["error"]["hint"]
        report, _, _ = await call(client, "check_environment")
        assert report["network_policy"] == "allow:allowed.test,*.sub.test"
    # The mismatched and missing server names were refused before any connection to port 443;
    # the matching one made exactly one.
    assert connections(test_hosts, 443) == before_443 + 1


async def test_sessions_use_the_proxy_and_the_socket_goes_with_the_run(snakebox_bin, tmp_path, mode, test_hosts):
    import json

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    script = FETCH + 'out["allowed"] = fetch("http://allowed.test/")\nout["loop"] = fetch("http://loop.test/")\nprint(json.dumps(out))\n'
    async with connect(snakebox_bin, data_dir, mode, *server_args("on")) as client:
        data, _, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        assert json.loads(data["stdout"])["allowed"] == "hello from the allowed test host"
        # The run's proxy socket is gone with the run.
        sockets = [p for p in (data_dir / "runs").rglob("egress.sock")] if (data_dir / "runs").exists() else []
        assert not any(data["execution_id"] in str(p) for p in sockets), sockets
        assert len(sockets) <= 2, sockets  # at most those of the pooled sandboxes waiting
        session, _, _ = await call(client, "create_session")
        sid = session["session_id"]
        cell, _, _ = await call(client, "execute_python", session_id=sid, script=script)
        assert cell["status"] == "ok", cell
        out = json.loads(cell["stdout"])
        assert out["interfaces"] == ["lo"] and out["allowed"] == "hello from the allowed test host", out
        assert out["loop"].startswith("failed")
        assert [e["allowed"] for e in cell["network_log"]] == [True, False], cell["network_log"]


@pytest.mark.parametrize("launch", [pytest.param("forked", marks=pytest.mark.native_only(FORK_SERVER_ONLY)), "pooled"])
async def test_every_launch_path_has_its_own_proxy_and_log(snakebox_bin, tmp_path, mode, test_hosts, launch):
    """Cold, then forked (fork server) or pooled (warm pool) runs: each reaches the allowed
    host through a proxy of its own, so each log holds exactly its own connection."""
    import json

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    extra = ["--fork-server", "off"] if launch == "pooled" else []
    async with connect(snakebox_bin, data_dir, mode, *server_args("on"), *extra) as client:
        for i in range(6):
            script = FETCH + f'out["allowed"] = fetch("http://allowed.test/?run={i}")\nprint(json.dumps(out))\n'
            data, _, _ = await call(client, "execute_python", script=script)
            assert data["status"] == "ok", data
            out = json.loads(data["stdout"])
            assert out["interfaces"] == ["lo"] and out["allowed"] == "hello from the allowed test host", (i, out)
            assert [(e["host"], e["allowed"]) for e in data["network_log"]] == [("allowed.test", True)], (i, data["network_log"])
            if i == 0:
                time.sleep(3)  # let the pool learn the default and start its sandboxes
        report, _, _ = await call(client, "check_environment")
        pool = report["warm_pool"]
        if launch == "forked":
            assert pool["forked"] >= 1, pool
            # No run is in flight and no sandbox is pooled beside a fork server: no proxy
            # socket is left in the run directories.
            assert list((data_dir / "runs").rglob("egress.sock")) == []
        else:
            assert pool["served"] >= 1, pool



async def test_a_name_that_rebinds_to_loopback_is_refused(snakebox_bin, data_dir, mode, test_hosts):
    """The proxy resolves each connection once and checks the answer it connects to: a name
    that answered the test host first and loopback next is refused the second time."""
    import json

    listener = LoopbackListener()
    name = f"{mode}.rebind.test"
    script = FETCH + f'out["first"] = fetch("http://{name}/")\nout["second"] = fetch("http://{name}/")\nprint(json.dumps(out))\n'
    async with connect(snakebox_bin, data_dir, mode, "--network", "on", "--network-resolvers", REBIND_DNS) as client:
        data, _, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        out = json.loads(data["stdout"])
        assert out["first"] == "hello from the allowed test host", out
        assert out["second"].startswith("failed"), out
        log = data["network_log"]
        assert [e["allowed"] for e in log] == [True, False], log
        assert "127.0.0.1 (loopback)" in log[1]["reason"], log
    assert listener.accepted == 0


async def test_session_policy_and_commands_use_the_proxy(snakebox_bin, tmp_path, mode, test_hosts):
    """A session narrowed at creation keeps that policy; its shell commands go through the
    same proxy (an isolated interpreter bridges first)."""
    import json

    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    async with connect(snakebox_bin, data_dir, mode, *server_args("allow:allowed.test,other.test")) as client:
        wider, _, is_error = await call(client, "create_session", allowed_domains=["evil.test"])
        assert is_error and "does not allow" in wider["error"]["message"], wider
        session, text, _ = await call(client, "create_session", allowed_domains=["allowed.test"])
        assert session["allowed_domains"] == ["allowed.test"] and "only allowed.test" in text, session
        sid = session["session_id"]
        cell, _, _ = await call(client, "execute_python", session_id=sid, script=FETCH + 'out["a"] = fetch("http://allowed.test/")\nout["o"] = fetch("http://other.test/")\nprint(json.dumps(out))\n')
        assert cell["status"] == "ok", cell
        out = json.loads(cell["stdout"])
        assert out["a"] == "hello from the allowed test host" and out["o"].startswith("failed"), out
        assert "allowlist" in cell["network_log"][1]["reason"]
        command = "python -c \"import urllib.request; print(urllib.request.urlopen('http://allowed.test/', timeout=20).read().decode())\""
        ran, _, _ = await call(client, "run_command", session_id=sid, command=command)
        assert ran["status"] == "ok", ran
        assert ran["stdout"].strip() == "hello from the allowed test host"
        assert [(e["host"], e["allowed"]) for e in ran["network_log"]] == [("allowed.test", True)]
        narrowed, _, is_error = await call(client, "execute_python", session_id=sid, script="1", allowed_domains=["allowed.test"])
        assert is_error and "fixed when it was created" in narrowed["error"]["message"]



async def test_N09_allowlist_bypasses_are_refused(snakebox_bin, data_dir, mode, test_hosts):
    """Catalogue N-09 against the test hosts: apex and lookalike names, an absolute URI that
    disagrees with its Host header (both ways), SOCKS5 with a raw address, the IPv6 literal
    form, and ignoring the proxy altogether."""
    import json

    before_80 = connections(test_hosts, 80)
    script = FETCH + f"""
for name in ["sub.test", "evilallowed.test", "allowed.test.evil.test", "x.sub.test.evil.test"]:
    out[name] = fetch("http://" + name + "/")
def raw(request):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(request)
    data = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return data.decode(errors="replace")
        data += chunk
out["uri_other_host_allowed"] = raw(b"GET http://other.test/ HTTP/1.1\\r\\nHost: allowed.test\\r\\n\\r\\n")
out["uri_allowed_host_other"] = raw(b"GET http://allowed.test/ HTTP/1.1\\r\\nHost: other.test\\r\\nX-Echo-Host: 1\\r\\n\\r\\n")
out["connect_v6"] = raw(b"CONNECT [::1]:443 HTTP/1.1\\r\\n\\r\\n")
out["socks_ip"] = list(raw(bytes([5, 1, 0, 5, 1, 0, 1, 198, 51, 100, 3, 0, 80])).encode()[:4])
s = socket.socket()
s.settimeout(3)
try:
    s.connect(("{WEB}", 80))
    out["direct"] = "connected"
except OSError as err:
    out["direct"] = "refused: " + str(err)
print(json.dumps(out))
"""
    async with connect(snakebox_bin, data_dir, mode, *server_args("allow:allowed.test,*.sub.test")) as client:
        data, _, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        out = json.loads(data["stdout"])
        for name in ["sub.test", "evilallowed.test", "allowed.test.evil.test", "x.sub.test.evil.test"]:
            assert out[name].startswith("failed: HTTPError"), (name, out[name])
        assert out["uri_other_host_allowed"].startswith("HTTP/1.1 403"), out
        # The Host header the test host saw is the checked name, not the client's.
        assert out["uri_allowed_host_other"].startswith("HTTP/1.0 200"), out
        assert out["uri_allowed_host_other"].endswith("\r\n\r\nallowed.test"), out
        assert out["connect_v6"].startswith("HTTP/1.1 403"), out
        assert out["socks_ip"] == [5, 0, 5, 2], out
        assert out["direct"].startswith("refused"), out
        reasons = {e["host"]: e["reason"] for e in data["network_log"] if not e["allowed"]}
        for name in ["sub.test", "evilallowed.test", "allowed.test.evil.test", "x.sub.test.evil.test", "other.test"]:
            assert "allowlist" in reasons[name], (name, reasons)
        assert "IP address" in reasons["::1"] and "IP address" in reasons[WEB]
        assert [e["host"] for e in data["network_log"] if e["allowed"]] == ["allowed.test"]
    # Only the one allowed request reached the test host.
    assert connections(test_hosts, 80) == before_80 + 1



async def test_requests_and_pip_use_the_proxy_unchanged(snakebox_bin, data_dir, mode, test_hosts):
    """requests and pip (installed in the run's environment from the configured index) reach an
    allowed test host through the proxy with no configuration: pip installs a wheel from a
    simple index the test host serves."""
    import json

    script = """
import json, os, subprocess, sys, requests
out = {"requests": requests.get("http://allowed.test/", timeout=20).text}
other = requests.get("http://other.test/", timeout=20)
out["other"] = [other.status_code, "allowlist" in other.text]
pip = subprocess.run([sys.executable, "-m", "pip", "install", "--disable-pip-version-check", "--no-cache-dir",
                      "--target", "/tmp/pkgs", "--index-url", "http://allowed.test/simple/", "--trusted-host", "allowed.test", "snbtpkg==1.0"],
                     capture_output=True, text=True)
out["pip"] = pip.returncode
if pip.returncode:
    print(pip.stdout[-3000:], pip.stderr[-3000:], file=sys.stderr)
sys.path.insert(0, "/tmp/pkgs")
import snbtpkg
out["imported"] = snbtpkg.VALUE
print(json.dumps(out))
"""
    async with connect(snakebox_bin, data_dir, mode, *server_args("allow:allowed.test")) as client:
        data, _, _ = await call(client, "execute_python", script=script,
                                dependencies=["requests>=2.31", "pip>=24"], timeout_seconds=120)
        assert data["status"] == "ok", (data["stderr"], data["network_log"])
        out = json.loads(data["stdout"])
        # The refusal of a plain-HTTP request is the proxy's 403, whose body says why.
        assert out == {"requests": "hello from the allowed test host", "other": [403, True], "pip": 0,
                       "imported": "from the local index"}, data
        paths = [e for e in data["network_log"] if e["allowed"]]
        assert all(e["host"] == "allowed.test" for e in paths) and len(paths) >= 3, data["network_log"]



async def test_https_to_an_allowed_name_verifies_end_to_end(snakebox_bin, data_dir, mode, test_hosts):
    """TLS passes through the proxy untouched: urllib verifies the test host's certificate
    (signed by a CA the call hands the run as an input file) through CONNECT."""
    import json

    ca = (test_hosts / "ca.pem").read_text()
    script = FETCH + """
import ssl
ctx = ssl.create_default_context(cafile="ca.pem")
out["https"] = urllib.request.urlopen("https://allowed.test/", timeout=20, context=ctx).read().decode()
try:
    urllib.request.urlopen("https://other.test/", timeout=20, context=ctx)
    out["other"] = "reached"
except Exception as err:
    out["other"] = "failed: " + type(err).__name__
print(json.dumps(out))
"""
    async with connect(snakebox_bin, data_dir, mode, *server_args("allow:allowed.test")) as client:
        data, _, _ = await call(client, "execute_python", script=script, files=[{"path": "ca.pem", "content": ca}])
        assert data["status"] == "ok", (data["stderr"], data["network_log"])
        out = json.loads(data["stdout"])
        assert out["https"] == "hello over TLS from the allowed test host", out
        assert out["other"].startswith("failed"), out
        log = [(e["host"], e["port"], e["allowed"]) for e in data["network_log"]]
        assert log == [("allowed.test", 443, True), ("other.test", 443, False)], data["network_log"]
        assert data["network_log"][0]["bytes_received"] > 0



def package_requests(logs: Path) -> list[str]:
    """`host path` of every request the package host answered."""
    path = logs / "pkgs.log"
    return path.read_text().splitlines() if path.exists() else []


def fresh_data_dir(tmp_path: Path, name: str) -> Path:
    path = tmp_path / name
    path.mkdir()
    path.chmod(0o755)
    return path


INSTALL_ENV = {"UV_INDEX_URL": f"http://{PKGS}:8000/simple"}


async def test_installs_reach_the_index_and_exactly_the_install_hosts(snakebox_bin, tmp_path, mode, test_hosts):
    """Issue 13: installs go through the run proxy's machinery with the install rules. The
    configured index (PKGS:8000) is always reached; its page links the wheel on PKGS:80, a
    destination reached only when `[network] install_hosts` names it; with another host
    listed the download is refused by the proxy, and the error names the host, the reason and
    `install_hosts`. A direct URL to a host not listed (FAR) is refused before anything runs."""
    import json

    script = "import snbtfar\nprint(snbtfar.VALUE)\n"
    # Named in install_hosts: the index page, then the wheel from the files host.
    async with connect(snakebox_bin, fresh_data_dir(tmp_path, "listed"), mode,
                       "--network-install-hosts", PKGS, env=INSTALL_ENV) as client:
        data, _, _ = await call(client, "execute_python", script=script, dependencies=["snbtfar==1.0"], timeout_seconds=60)
        assert data["status"] == "ok", data
        assert data["stdout"].strip() == "from the files host"
        report, _, _ = await call(client, "check_environment")
        assert f"only {PKGS}" in report["install_network"], report["install_network"]
        assert PKGS in report["cache"]["installs"], report["cache"]["installs"]
        # A direct URL whose host is not listed: refused by name before uv runs.
        before = package_requests(test_hosts)
        direct = f"snbtfar @ http://{FAR}/files/snbtfar-1.0-py3-none-any.whl"
        data, _, is_error = await call(client, "execute_python", script=script, dependencies=[direct])
        assert is_error and data["status"] in ("setup_failed", "invalid_request"), data
        message = json.dumps(data["error"])
        assert f"`{FAR}`, which is not an install host" in data["error"]["message"], message
        assert "install_hosts" in data["error"]["hint"], message
        session, _, _ = await call(client, "create_session")
        installed, _, is_error = await call(client, "install_packages", session_id=session["session_id"], packages=[direct])
        assert is_error and f"`{FAR}`, which is not an install host" in json.dumps(installed), installed
        assert not any(line.startswith(FAR) for line in package_requests(test_hosts)[len(before):])
    hosts_seen = {line.split()[0] for line in package_requests(test_hosts)}
    assert {f"{PKGS}:8000", PKGS} <= hosts_seen, hosts_seen

    # Another host listed: the index is still reached, the files host is not; uv only sees a
    # 403, and the error says what the proxy refused and why.
    before = package_requests(test_hosts)
    async with connect(snakebox_bin, fresh_data_dir(tmp_path, "other"), mode,
                       "--network-install-hosts", "198.51.100.7", env=INSTALL_ENV) as client:
        data, _, is_error = await call(client, "execute_python", script=script, dependencies=["snbtfar==1.0"], timeout_seconds=60)
        assert is_error and data["status"] == "setup_failed", data
        message = data["error"]["message"]
        assert f"install proxy refused `{PKGS}:80`" in message, message
        assert f"`{PKGS}` is not in the install hosts" in message, message
        assert "install_hosts" in data["error"]["hint"], data["error"]
        # The same refusal for a session's install.
        session, _, _ = await call(client, "create_session")
        installed, _, is_error = await call(client, "install_packages", session_id=session["session_id"], packages=["snbtfar==1.0"])
        assert is_error and f"install proxy refused `{PKGS}:80`" in json.dumps(installed), installed
    seen = package_requests(test_hosts)[len(before):]
    assert any(line.startswith(f"{PKGS}:8000 /simple/snbtfar") for line in seen), seen
    assert not any(line.split()[0] in (PKGS, FAR) for line in seen), seen


async def test_the_connection_cap_is_a_setting(snakebox_bin, tmp_path, mode, test_hosts):
    """`[network] max_connections`: with 1, a run's second connection is refused and logged
    with the cap; check_environment reports the caps in force."""
    import json

    script = FETCH + 'out["first"] = fetch("http://allowed.test/")\nout["second"] = fetch("http://allowed.test/")\nprint(json.dumps(out))\n'
    async with connect(snakebox_bin, fresh_data_dir(tmp_path, "capped"), mode, *server_args("on"),
                       "--network-max-connections", "1", "--network-max-bytes", "1MiB",
                       "--network-max-connection-seconds", "30") as client:
        data, _, _ = await call(client, "execute_python", script=script)
        assert data["status"] == "ok", data
        out = json.loads(data["stdout"])
        assert out["first"] == "hello from the allowed test host", out
        assert out["second"].startswith("failed"), out
        log = data["network_log"]
        assert [(e["host"], e["allowed"]) for e in log] == [("allowed.test", True), ("allowed.test", False)], log
        assert "cap of 1 connections" in log[1]["reason"], log
        report, _, _ = await call(client, "check_environment")
        assert report["network_caps"] == {"connections": 1, "bytes": 1 << 20, "connection_seconds": 30}, report["network_caps"]
        assert "1 connections, 1048576 bytes, 30 s per connection" in report["network_enforcement"]


@pytest.mark.native_only(FORK_SERVER_ONLY)
async def test_a_narrowed_call_is_forked_with_its_own_narrowed_proxy(snakebox_bin, tmp_path, mode, test_hosts):
    """A call that narrows the policy (`allowed_domains`) no longer runs cold: it is forked
    from the environment's fork server (which holds no network), and its own proxy has the
    narrowed list. It takes no pooled sandbox (their proxies hold the whole policy)."""
    import json

    script = FETCH + 'out["a"] = fetch("http://allowed.test/")\nout["o"] = fetch("http://other.test/")\nprint(json.dumps(out))\n'
    async with connect(snakebox_bin, fresh_data_dir(tmp_path, "narrowed"), mode,
                       *server_args("allow:allowed.test,other.test")) as client:
        whole, _, _ = await call(client, "execute_python", script=script)
        assert whole["status"] == "ok", whole
        assert json.loads(whole["stdout"])["o"] == "hello from the allowed test host"
        forked_before = None
        for attempt in range(20):
            report, _, _ = await call(client, "check_environment")
            if report["warm_pool"].get("fork_servers"):
                forked_before = report["warm_pool"]["forked"]
                break
            time.sleep(0.5)
        assert forked_before is not None, report["warm_pool"]
        for _ in range(2):
            data, _, _ = await call(client, "execute_python", script=script, allowed_domains=["allowed.test"])
            assert data["status"] == "ok", data
            out = json.loads(data["stdout"])
            assert out["a"] == "hello from the allowed test host" and out["o"].startswith("failed"), out
            log = data["network_log"]
            assert [(e["host"], e["allowed"]) for e in log] == [("allowed.test", True), ("other.test", False)], log
            assert "allowlist" in log[1]["reason"], log
        report, _, _ = await call(client, "check_environment")
        assert report["warm_pool"]["forked"] >= forked_before + 2, report["warm_pool"]
