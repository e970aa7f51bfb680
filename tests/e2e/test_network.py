"""Network policy per call: off by default; a call asking for network on a server that does not
allow it is refused with the reason; on a server that allows it, a call may still opt out."""

from __future__ import annotations

import socket

import pytest

from conftest import call, connect

pytestmark = pytest.mark.anyio

INTERFACES = "import json, socket\nprint(json.dumps(sorted(name for _, name in socket.if_nameindex())))\n"


def host_interfaces() -> list[str]:
    return sorted(name for _, name in socket.if_nameindex())


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


async def test_a_server_with_network_gives_it_unless_the_call_opts_out(snakebox_bin, data_dir, mode):
    if host_interfaces() == ["lo"]:
        pytest.skip("this host has only loopback: a shared network namespace looks the same as a new one")
    async with connect(snakebox_bin, data_dir, mode, "--network", "on") as client:
        shared, _, _ = await call(client, "execute_python", script=INTERFACES)
        assert shared["status"] == "ok", shared
        assert shared["stdout"].strip() != '["lo"]'
        offline, _, _ = await call(client, "execute_python", script=INTERFACES, network=False)
        assert offline["status"] == "ok", offline
        assert offline["stdout"].strip() == '["lo"]'
        report, _, _ = await call(client, "check_environment")
        assert report["network"] is True
