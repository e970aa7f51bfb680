"""The front's `kubernetes` directory (issue 35, T2) against a SIMULATION of Kubernetes: a real
`snakebox serve --http --directory kubernetes` front, real `snakebox agent` processes, real MCP
clients over HTTP, and in place of a cluster `kube_sim.KubeSim`, a small simulated API server on
loopback with a scripted stand-in for agent-sandbox's claim controller (it sets a claim's status
to Ready with the address of one of the agents).

What is real: the front's kube client (list, watch, create, patch, delete over HTTP), its cache
and its errors, the agents and the tokens the front signs for them (each agent is named by its
pod address `IP:PORT`, as in a pod). What is simulated: the API server, agent-sandbox's
controller, the pods (three agents on 127.0.0.2-4, one port), the warm pool (a list of free
addresses; `cold_delay` plays an empty pool, `never_ready` a pool that never serves).
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any, AsyncIterator, Iterator

import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client

from conftest import call, have_bwrap
from http_support import http_server, make_key
from kube_sim import KubeSim
from test_agents import agent_process

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not have_bwrap(), reason="bubblewrap is not installed"),
]

NAMESPACE = "snakebox-sim"
HOSTS = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
SESSION_LABEL = "snakebox.dev/session"
KIND_LABEL = "snakebox.dev/kind"


def shared_free_port() -> int:
    """A port free on every simulated pod address."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        try:
            for host in HOSTS:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    raise RuntimeError("no port free on every simulated pod address")


class Cluster:
    def __init__(self, binary: Path, root: Path, sim: KubeSim, private: Path, port: int):
        self.binary, self.root, self.sim, self.private, self.port = binary, root, sim, private, port
        self.kubeconfig = sim.kubeconfig(root / "kubeconfig")
        self.front_data = root / "front"
        self.keys = {tenant: make_key(binary, self.front_data, tenant) for tenant in ("team-a", "team-b")}

    @contextlib.contextmanager
    def front(self, *extra: str, log: Path | None = None, config: bool = False) -> Iterator[str]:
        """A front with the kubernetes directory: by flags, or by the config file's `[front]`."""
        if config:
            path = self.root / "front.toml"
            path.write_text(f'[front]\ndirectory = "kubernetes"\nnamespace = "{NAMESPACE}"\n'
                            f"front_key = {json.dumps(str(self.private))}\nagent_port = {self.port}\n")
            args: tuple[str, ...] = ("--config", str(path), "--warm-pool", "0", *extra)
        else:
            args = ("--directory", "kubernetes", "--namespace", NAMESPACE, "--front-key", str(self.private),
                    "--agent-port", str(self.port), "--warm-pool", "0", *extra)
        with http_server(self.binary, self.front_data, *args, log_path=log,
                         env={"KUBECONFIG": str(self.kubeconfig), "HOME": str(self.root)}) as (_, url):
            deadline = time.monotonic() + 20
            while ready(url)[1] is not True and time.monotonic() < deadline:
                time.sleep(0.1)
            yield url


def ready(url: str) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(f"{url}/readyz", timeout=10) as response:
            body = json.loads(response.read())
            return response.status, body["ready"]
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read()).get("ready")


@pytest.fixture(scope="module")
def cluster(snakebox_bin: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    root = tmp_path_factory.mktemp("kube-sim")
    subprocess.run([str(snakebox_bin), "keys", "front-keypair", "--out", str(root / "keys")],
                   check=True, capture_output=True, timeout=60)
    private, public = root / "keys" / "front.key", root / "keys" / "front.pub"
    port = shared_free_port()
    sim = KubeSim(NAMESPACE, HOSTS).start()
    try:
        with contextlib.ExitStack() as stack:
            for n, host in enumerate(HOSTS):
                stack.enter_context(agent_process(snakebox_bin, root / f"agent{n}", public, host=host, port=port))
            yield Cluster(snakebox_bin, root, sim, private, port)
    finally:
        sim.stop()


@pytest.fixture
def sim(cluster: Cluster) -> Iterator[KubeSim]:
    """The simulation, its knobs reset and every claim deleted after each test (the addresses
    return to the pool)."""
    yield cluster.sim
    cluster.sim.cold_delay = 0.0
    cluster.sim.never_ready = False
    for name in list(cluster.sim.snapshot()):
        cluster.sim.delete_claim(name)


@contextlib.asynccontextmanager
async def connect(url: str, key: str) -> AsyncIterator[Client]:
    http = create_mcp_http_client(headers={"Authorization": f"Bearer {key}"})
    async with http, Client(streamable_http_client(f"{url}/mcp", http_client=http), mode="auto",
                            read_timeout_seconds=120) as client:
        yield client


def claim_of(sim: KubeSim, session_id: str) -> tuple[str, dict[str, Any]]:
    found = [(name, obj) for name, obj in sim.snapshot().items()
             if obj["metadata"].get("annotations", {}).get("snakebox.dev/session-id") == session_id]
    assert len(found) == 1, (session_id, sim.snapshot())
    return found[0]


async def test_simulation_a_session_claims_a_sandbox_waits_for_ready_and_deletes_it_on_close(cluster: Cluster, sim: KubeSim):
    with cluster.front("--runner-idle-ttl", "2") as url:
        assert ready(url) == (200, True)
        # The cache was listed, then watched from the list's version.
        assert sim.requests_of("GET", watch=False) and sim.requests_of("GET", watch=True)
        watch = sim.requests_of("GET", watch=True)[0]
        assert watch["labelSelector"] == "app.kubernetes.io/managed-by=snakebox", watch
        async with connect(url, cluster.keys["team-a"]) as a:
            session, text, is_error = await call(a, "create_session", name="kube")
            assert not is_error, text
            sid = session["session_id"]
            name, claim = claim_of(sim, sid)
            labels, notes = claim["metadata"]["labels"], claim["metadata"]["annotations"]
            assert labels[KIND_LABEL] == "session" and labels["snakebox.dev/tenant"].startswith("t-team-a-"), labels
            assert labels[SESSION_LABEL].startswith("s-"), labels
            assert notes["snakebox.dev/tenant"] == "team-a", notes
            ip = claim["status"]["sandbox"]["podIPs"][0]
            assert notes["snakebox.dev/agent"] == f"{ip}:{cluster.port}", notes
            assert claim["spec"]["warmPoolRef"]["name"].startswith("agent-standard-"), claim["spec"]
            assert claim["spec"]["lifecycle"]["shutdownPolicy"] == "Delete", claim["spec"]
            assert claim["spec"]["lifecycle"]["shutdownTime"], claim["spec"]
            for script in ("x = 20", "x += 1", "print(x * 2)"):
                cell, text, is_error = await call(a, "execute_python", script=script, session_id=sid)
                assert not is_error, text
            assert cell["stdout"] == "42\n", text

            # A one-shot run goes to the tenant's runner claim.
            run, text, is_error = await call(a, "execute_python", script="print('one-shot')")
            assert not is_error and run["stdout"] == "one-shot\n", text
            runners = [o for o in sim.snapshot().values() if o["metadata"]["labels"][KIND_LABEL] == "runner"]
            assert len(runners) == 1 and runners[0]["metadata"]["annotations"]["snakebox.dev/tenant"] == "team-a"

            # Another tenant neither sees nor reaches the session.
            async with connect(url, cluster.keys["team-b"]) as b:
                listed, _, _ = await call(b, "list_sessions")
                assert listed["sessions"] == [], listed
                stolen, text, is_error = await call(b, "execute_python", script="print(x)", session_id=sid)
                assert is_error and stolen["error"]["kind"] == "not_found", text

            listed, text, _ = await call(a, "list_sessions")
            assert [s["session_id"] for s in listed["sessions"]] == [sid], text
            # Closing the session deletes its claim (and so frees its sandbox).
            _, text, is_error = await call(a, "delete_session", session_id=sid)
            assert not is_error, text
            assert name not in sim.snapshot()
            assert any(True for q in sim.requests if q[0] == "DELETE" and q[1].endswith(f"/{name}"))
            # The runner claim goes after its idle time.
            assert sim.wait_for(lambda claims: not any(
                o["metadata"]["labels"][KIND_LABEL] == "runner" for o in claims.values()), timeout=15), sim.snapshot()


async def test_simulation_a_watch_that_ends_is_resumed_and_410_gone_is_relisted(cluster: Cluster, sim: KubeSim):
    with cluster.front() as url:
        async with connect(url, cluster.keys["team-a"]) as a:
            first, text, is_error = await call(a, "create_session")
            assert not is_error, text
            await call(a, "execute_python", script="v = 1", session_id=first["session_id"])

            # The API server ends every watch: the front watches again, from where it was.
            watches = len(sim.requests_of("GET", watch=True))
            lists = len(sim.requests_of("GET", watch=False))
            sim.end_watches()
            deadline = time.monotonic() + 10
            while len(sim.requests_of("GET", watch=True)) <= watches and time.monotonic() < deadline:
                time.sleep(0.05)
            again = sim.requests_of("GET", watch=True)[watches:]
            assert again and int(again[0]["resourceVersion"]) > 1000, again
            assert len(sim.requests_of("GET", watch=False)) == lists, "a watch that ended was relisted"
            # ...and sees the next claim become Ready through that watch.
            second, text, is_error = await call(a, "create_session")
            assert not is_error, text

            # The history is compacted: the next watch is answered 410 Gone, and the front lists
            # again, then watches from the new list.
            sim.compact()
            deadline = time.monotonic() + 10
            while len(sim.requests_of("GET", watch=False)) <= lists and time.monotonic() < deadline:
                time.sleep(0.05)
            relists = [q for q in sim.requests_of("GET", watch=False) if q.get("labelSelector") == "app.kubernetes.io/managed-by=snakebox"]
            assert len(relists) >= 2, sim.requests_of("GET", watch=False)
            third, text, is_error = await call(a, "create_session")
            assert not is_error, text
            for session, value in ((first, 1), (second, None), (third, None)):
                cell, text, is_error = await call(a, "execute_python", script="print(globals().get('v'))",
                                                  session_id=session["session_id"])
                assert not is_error and cell["stdout"] == f"{value}\n", text
            assert ready(url) == (200, True)


async def test_simulation_an_empty_pool_is_waited_for_and_a_claim_never_ready_fails_loudly(cluster: Cluster, sim: KubeSim):
    with cluster.front("--claim-ready-timeout", "4") as url:
        async with connect(url, cluster.keys["team-a"]) as a:
            # An empty warm pool: the sandbox starts cold; the call waits for it.
            sim.cold_delay = 2.0
            started = time.monotonic()
            slow, text, is_error = await call(a, "create_session")
            assert not is_error, text
            assert time.monotonic() - started >= 2.0
            sim.cold_delay = 0.0

            # A claim that never becomes Ready: a clear error within the timeout, no hang, and
            # the claim deleted.
            sim.never_ready = True
            before = set(sim.snapshot())
            started = time.monotonic()
            failed, text, is_error = await call(a, "create_session")
            took = time.monotonic() - started
            assert is_error and failed["error"]["kind"] == "unavailable", text
            assert 4.0 <= took < 15.0, took
            assert "was not Ready within 4 s" in text and "SandboxNotReady" in text, text
            assert "kubectl get sandboxwarmpool" in text and "hint" in text, text
            assert set(sim.snapshot()) == before, "the claim that was never Ready was left behind"
            assert len(sim.requests_of("DELETE")) >= 1

            # Proof of life: the pool serves again, and the slow session still works.
            sim.never_ready = False
            fresh, text, is_error = await call(a, "create_session")
            assert not is_error, text
            cell, text, is_error = await call(a, "execute_python", script="print('alive')", session_id=slow["session_id"])
            assert not is_error and cell["stdout"] == "alive\n", text


async def test_simulation_a_restarted_front_rebuilds_its_cache_and_a_deleted_claim_is_a_lost_session(cluster: Cluster, sim: KubeSim):
    with cluster.front() as url:
        async with connect(url, cluster.keys["team-a"]) as a:
            session, text, is_error = await call(a, "create_session")
            assert not is_error, text
            sid = session["session_id"]
            await call(a, "execute_python", script="kept = 41", session_id=sid)
    # A new front process, nothing of the first one's (configured by the config file's [front]
    # this time): its cache is rebuilt from the claims.
    lists = len(sim.requests_of("GET", watch=False))
    with cluster.front(config=True) as url:
        assert len(sim.requests_of("GET", watch=False)) == lists + 1
        async with connect(url, cluster.keys["team-a"]) as a:
            cell, text, is_error = await call(a, "execute_python", script="print(kept + 1)", session_id=sid)
            assert not is_error and cell["stdout"] == "42\n", text
            # No lookup by label was needed: the session was in the rebuilt cache.
            assert not [q for q in sim.requests_of("GET", watch=False) if SESSION_LABEL in q.get("labelSelector", "")]

            # The controller deletes the claim (its shutdownTime passed): the session is lost,
            # said with a hint, and other calls go on.
            name, _ = claim_of(sim, sid)
            sim.delete_claim(name)
            deadline = time.monotonic() + 10
            while True:
                lost, text, is_error = await call(a, "execute_python", script="print(kept)", session_id=sid)
                if is_error or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert is_error and lost["error"]["kind"] == "session_lost", text
            assert name in text and "shutdownTime" in text and "new session" in text, text
            run, text, is_error = await call(a, "execute_python", script="print('still here')")
            assert not is_error and run["stdout"] == "still here\n", text
