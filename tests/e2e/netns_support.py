"""Test hosts of a module's own: a network namespace joined to the host by a veth pair, with
the test hosts' addresses inside. The network and secrets tests run their name servers and
listeners in one each.

Addresses: 198.51.100.0/24 only (`test_network` the lower half, `test_secrets` the upper).
The other documentation ranges (192.0.2.0/24, 203.0.113.0/24) may be in use by the machine's
own network, and a test route over them cuts the machine off from its package registries
while the namespace lives."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


def make_namespace(name: str, host_side: str, ns_side: str, host_cidr: str, cidrs: list[str]) -> list[str]:
    """Create namespace `name` and a veth pair (`host_side` on the host with `host_cidr`,
    `ns_side` inside with `cidrs`), loopback up inside; return the command prefix that runs a
    program inside. Undo with `remove_namespace`, whatever happened."""
    _ip("netns", "add", name)
    _ip("link", "add", host_side, "type", "veth", "peer", "name", ns_side)
    _ip("link", "set", ns_side, "netns", name)
    _ip("addr", "add", host_cidr, "dev", host_side)
    _ip("link", "set", host_side, "up")
    inside = ["ip", "netns", "exec", name]
    steps = [["link", "set", "lo", "up"], *(["addr", "add", cidr, "dev", ns_side] for cidr in cidrs),
             ["link", "set", ns_side, "up"]]
    for args in steps:
        subprocess.run([*inside, "ip", *args], check=True, capture_output=True)
    return inside


def remove_namespace(name: str, host_side: str) -> None:
    subprocess.run(["ip", "link", "del", host_side], capture_output=True)
    subprocess.run(["ip", "netns", "del", name], capture_output=True)


def make_certificates(directory: Path, names: list[str], ca_name: str) -> None:
    """A test CA (`ca.pem`, common name `ca_name`) and one certificate for every name of
    `names` signed by it (`host.pem`, `host.key`), in `directory`. Python 3.13's default
    context checks strictly (VERIFY_X509_STRICT): critical CA constraints, key usages, an
    authority key identifier on the leaf."""
    def openssl(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=directory)

    curve = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    openssl("req", "-x509", *curve, "-keyout", "ca.key", "-out", "ca.pem", "-days", "2", "-subj", f"/CN={ca_name}",
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", *curve, "-keyout", "host.key", "-out", "host.csr", "-subj", f"/CN={names[0]}")
    alt = ",".join(f"DNS:{name}" for name in names)
    (directory / "san.ext").write_text(
        f"subjectAltName={alt}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nauthorityKeyIdentifier=keyid\nsubjectKeyIdentifier=hash\n"
    )
    openssl("x509", "-req", "-in", "host.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "host.pem", "-days", "2", "-extfile", "san.ext")
