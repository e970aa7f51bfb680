"""A SIMULATION of the part of Kubernetes a snakebox front's `kubernetes` directory talks to
(issue 35, T2), over real HTTP on loopback: no cluster can run here.

- `KubeSim` is a small API server for one resource, agent-sandbox's `SandboxClaim`
  (`extensions.agents.x-k8s.io/v1beta1`) in one namespace: list (with a label selector and a
  `resourceVersion`), watch (chunked JSON lines, replaying events after the version asked,
  `ERROR` with `410 Gone` for a version older than the kept history, ended by its timeout or on
  demand), get, create (`409` on a name taken), JSON merge patch, delete. Errors are
  `Status` objects as the API server sends them. Every request is recorded for the tests.
- Its controller is a scripted stand-in for agent-sandbox's claim controller: a claim made is
  bound, after `cold_delay` seconds (an empty warm pool: the sandbox starts cold), to the next
  free address of `agents` (real `snakebox agent` processes), its status set to Ready with that
  pod IP; `never_ready` leaves claims unbound with `Ready=False`; a deleted claim frees its
  address.

What it is not: no authentication, no admission or schema validation (T3 checks the objects
against agent-sandbox's CRDs), no other kinds, one namespace.
"""

from __future__ import annotations

import copy
import json
import threading
import time
import urllib.parse
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

GROUP = "extensions.agents.x-k8s.io"
VERSION = "v1beta1"
API_VERSION = f"{GROUP}/{VERSION}"


def now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def merge(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge(result.get(key), value)
    return result


def matches(obj: dict[str, Any], selector: str | None) -> bool:
    """Equality-based label selectors (`a=b,c=d`), all snakebox uses."""
    if not selector:
        return True
    labels = obj.get("metadata", {}).get("labels") or {}
    for term in selector.split(","):
        key, _, value = term.partition("=")
        if labels.get(key.strip()) != value.strip():
            return False
    return True


def status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class KubeSim:
    """The simulated API server and its scripted controller (see the module's doc)."""

    def __init__(self, namespace: str, agents: list[str]):
        self.namespace = namespace
        self.cond = threading.Condition()
        self.version = 1000
        self.claims: dict[str, dict[str, Any]] = {}
        self.history: list[tuple[int, str, dict[str, Any]]] = []
        self.oldest = 0  # a watch from a version below this is answered 410 Gone
        self.free = list(agents)
        self.bound: dict[str, str] = {}  # claim name -> pod IP
        self.cold_delay = 0.0
        self.never_ready = False
        self.watch_generation = 0
        self.open_watches = 0
        self.requests: list[tuple[str, str, dict[str, str]]] = []
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    # ---- the test's side ------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def start(self) -> "KubeSim":
        self.thread.start()
        return self

    def stop(self) -> None:
        with self.cond:
            self.watch_generation += 1
            self.cond.notify_all()
        self.server.shutdown()
        self.server.server_close()

    def kubeconfig(self, path: Path) -> Path:
        """A kubeconfig for the front: this server, the namespace, a token (sent, not checked).
        JSON is YAML."""
        path.write_text(json.dumps({
            "apiVersion": "v1", "kind": "Config", "current-context": "sim",
            "clusters": [{"name": "sim", "cluster": {"server": self.url}}],
            "contexts": [{"name": "sim", "context": {"cluster": "sim", "user": "sim", "namespace": self.namespace}}],
            "users": [{"name": "sim", "user": {"token": "simulated"}}],
        }))
        return path

    def snapshot(self) -> dict[str, dict[str, Any]]:
        with self.cond:
            return copy.deepcopy(self.claims)

    def requests_of(self, method: str, *, watch: bool | None = None) -> list[dict[str, str]]:
        with self.cond:
            return [query for m, _, query in self.requests
                    if m == method and (watch is None or ("watch" in query) == watch)]

    def end_watches(self) -> None:
        """Every open watch ends now (as when the API server restarts or its timeout passes)."""
        with self.cond:
            self.watch_generation += 1
            self.cond.notify_all()

    def compact(self) -> None:
        """Forget the event history (etcd compaction): a watch from an older version gets `410
        Gone`; then end the open watches so that the front has to watch again."""
        with self.cond:
            self.history.clear()
            self.oldest = self.version + 1
            self.watch_generation += 1
            self.cond.notify_all()

    def delete_claim(self, name: str) -> None:
        """Delete a claim as the controller does at its `shutdownTime`."""
        with self.cond:
            self._delete(name)

    def wait_for(self, predicate, timeout: float = 10.0) -> bool:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate(self.claims):
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.cond.wait(left)
            return True

    # ---- the store --------------------------------------------------------------------------

    def _bump(self) -> str:
        self.version += 1
        return str(self.version)

    def _event(self, kind: str, obj: dict[str, Any]) -> None:
        self.history.append((self.version, kind, copy.deepcopy(obj)))
        self.cond.notify_all()

    def _delete(self, name: str) -> dict[str, Any] | None:
        obj = self.claims.pop(name, None)
        if obj is None:
            return None
        obj["metadata"]["resourceVersion"] = self._bump()
        self._event("DELETED", obj)
        ip = self.bound.pop(name, None)
        if ip is not None:
            self.free.append(ip)
            self._bind_waiting()
        return obj

    # ---- the scripted controller ----------------------------------------------------------

    def _schedule(self, name: str) -> None:
        if self.never_ready:
            self._set_status(name, None, "SandboxNotReady", "the sandbox has not become ready (simulated: never)")
            return
        if self.cold_delay > 0:
            self._set_status(name, None, "WarmPoolEmpty", "no warm sandbox: starting one (simulated cold start)")
            timer = threading.Timer(self.cold_delay, self._bind_later, args=(name,))
            timer.daemon = True
            timer.start()
        else:
            self._bind(name)

    def _bind_later(self, name: str) -> None:
        with self.cond:
            self._bind(name)

    def _bind(self, name: str) -> None:
        if name not in self.claims or name in self.bound:
            return
        if not self.free:
            self._set_status(name, None, "WarmPoolEmpty", "no free sandbox (simulated pool exhausted)")
            return
        ip = self.free.pop(0)
        self.bound[name] = ip
        self._set_status(name, ip, "SandboxReady", "")

    def _bind_waiting(self) -> None:
        for name in list(self.claims):
            if name not in self.bound and not self.never_ready and self.cold_delay == 0:
                self._bind(name)

    def _set_status(self, name: str, ip: str | None, reason: str, message: str) -> None:
        obj = self.claims[name]
        condition = {"type": "Ready", "status": "True" if ip else "False", "reason": reason,
                     "message": message, "lastTransitionTime": now(),
                     "observedGeneration": obj["metadata"].get("generation", 1)}
        obj["status"] = {"conditions": [condition]}
        if ip:
            obj["status"]["sandbox"] = {"name": f"sandbox-{name}", "podIPs": [ip]}
        obj["metadata"]["resourceVersion"] = self._bump()
        self._event("MODIFIED", obj)

    # ---- HTTP -------------------------------------------------------------------------------

    def _handler(self):
        sim = self
        prefix = f"/apis/{GROUP}/{VERSION}/namespaces/{sim.namespace}/sandboxclaims"

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # quiet
                pass

            def _send(self, code: int, body: Any) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _route(self, method: str) -> tuple[str | None, dict[str, str]] | None:
                parsed = urllib.parse.urlsplit(self.path)
                query = {k: v[-1] for k, v in urllib.parse.parse_qs(parsed.query).items()}
                with sim.cond:
                    sim.requests.append((method, parsed.path, query))
                if parsed.path == prefix:
                    return None, query
                if parsed.path.startswith(prefix + "/"):
                    return parsed.path[len(prefix) + 1:], query
                self._send(404, status(404, "NotFound", f"the server could not find the requested resource ({parsed.path}; simulated: only sandboxclaims in `{sim.namespace}`)"))
                return None

            def _body(self) -> Any:
                length = int(self.headers.get("Content-Length") or 0)
                return json.loads(self.rfile.read(length) or b"null")

            def do_GET(self) -> None:
                routed = self._route("GET")
                if routed is None:
                    return
                name, query = routed
                if name is not None:
                    with sim.cond:
                        obj = copy.deepcopy(sim.claims.get(name))
                    if obj is None:
                        self._send(404, status(404, "NotFound", f'sandboxclaims.{GROUP} "{name}" not found'))
                    else:
                        self._send(200, obj)
                    return
                if query.get("watch") in ("true", "1"):
                    self._watch(query)
                    return
                selector = query.get("labelSelector")
                with sim.cond:
                    items = [copy.deepcopy(o) for o in sim.claims.values() if matches(o, selector)]
                    version = str(sim.version)
                self._send(200, {"apiVersion": API_VERSION, "kind": "SandboxClaimList",
                                 "metadata": {"resourceVersion": version}, "items": items})

            def _watch(self, query: dict[str, str]) -> None:
                selector = query.get("labelSelector")
                since = int(query.get("resourceVersion") or 0)
                timeout = float(query.get("timeoutSeconds") or 300)
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()

                def chunk(obj: dict[str, Any] | None) -> None:
                    data = b"" if obj is None else json.dumps(obj).encode() + b"\n"
                    self.wfile.write(f"{len(data):x}\r\n".encode() + data + b"\r\n")
                    self.wfile.flush()

                deadline = time.monotonic() + timeout
                try:
                    with sim.cond:
                        generation = sim.watch_generation
                        sim.open_watches += 1
                    try:
                        if since and since < sim.oldest:
                            chunk({"type": "ERROR", "object": status(
                                410, "Expired", f"too old resource version: {since} ({sim.oldest})")})
                            chunk(None)
                            return
                        sent = since
                        while True:
                            with sim.cond:
                                pending = [(v, k, o) for v, k, o in sim.history if v > sent]
                                if not pending:
                                    if sim.watch_generation != generation or time.monotonic() >= deadline:
                                        break
                                    sim.cond.wait(min(0.5, max(0.0, deadline - time.monotonic())))
                                    continue
                            for version, kind, obj in pending:
                                sent = version
                                if matches(obj, selector):
                                    chunk({"type": kind, "object": obj})
                        chunk(None)
                    finally:
                        with sim.cond:
                            sim.open_watches -= 1
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def do_POST(self) -> None:
                routed = self._route("POST")
                if routed is None:
                    return
                name, _ = routed
                obj = self._body()
                if name is not None or not isinstance(obj, dict):
                    self._send(405, status(405, "MethodNotAllowed", "create a claim by POST to the collection"))
                    return
                meta = obj.setdefault("metadata", {})
                claim = meta.get("name")
                if not claim:
                    self._send(422, status(422, "Invalid", "metadata.name: Required value"))
                    return
                with sim.cond:
                    if claim in sim.claims:
                        self._send(409, status(409, "AlreadyExists", f'sandboxclaims.{GROUP} "{claim}" already exists'))
                        return
                    meta.update({"namespace": sim.namespace, "uid": str(uuid.uuid4()), "generation": 1,
                                 "creationTimestamp": now(), "resourceVersion": sim._bump()})
                    obj.setdefault("apiVersion", API_VERSION)
                    obj.setdefault("kind", "SandboxClaim")
                    sim.claims[claim] = obj
                    sim._event("ADDED", obj)
                    made = copy.deepcopy(obj)
                    sim._schedule(claim)
                self._send(201, made)

            def do_PATCH(self) -> None:
                routed = self._route("PATCH")
                if routed is None:
                    return
                name, _ = routed
                if self.headers.get("Content-Type", "").split(";")[0] != "application/merge-patch+json":
                    self._send(415, status(415, "UnsupportedMediaType", "simulated: merge patches only"))
                    return
                patch = self._body()
                with sim.cond:
                    obj = sim.claims.get(name or "")
                    if obj is None:
                        self._send(404, status(404, "NotFound", f'sandboxclaims.{GROUP} "{name}" not found'))
                        return
                    patched = merge(obj, patch)
                    patched["metadata"]["resourceVersion"] = sim._bump()
                    sim.claims[name] = patched
                    sim._event("MODIFIED", patched)
                    answer = copy.deepcopy(patched)
                self._send(200, answer)

            def do_DELETE(self) -> None:
                routed = self._route("DELETE")
                if routed is None:
                    return
                name, _ = routed
                self._body()
                with sim.cond:
                    obj = sim._delete(name or "")
                if obj is None:
                    self._send(404, status(404, "NotFound", f'sandboxclaims.{GROUP} "{name}" not found'))
                else:
                    self._send(200, obj)

        return Handler
