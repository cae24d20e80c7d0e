"""Test certificates made with the ``openssl`` command: a CA and a server certificate
for an IP address (subjectAltName), so TLS peers verify each other as in production."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from tests.peers import require_binary


@dataclass(frozen=True)
class Certs:
    ca: Path
    cert: Path
    key: Path


def make_certs(folder: Path, ips: tuple[str, ...] = ("127.0.0.1",)) -> Certs:
    """A throwaway CA and a certificate for the addresses ``ips`` signed by it."""
    openssl = require_binary("openssl", "apt-get install openssl")
    folder.mkdir(parents=True, exist_ok=True)
    ca_key, ca = folder / "ca.key", folder / "ca.pem"
    key, csr, cert = folder / "server.key", folder / "server.csr", folder / "server.pem"
    ext = folder / "ext.cnf"
    sans = ",".join(f"IP:{ip}" for ip in ips)
    ext.write_text(f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n")

    def run(*args: str) -> None:
        subprocess.run([openssl, *args], check=True, capture_output=True, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key), "-out", str(ca),
        "-days", "2", "-subj", "/CN=mdeci test CA")  # fmt: skip
    run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
        "-subj", f"/CN={ips[0]}")  # fmt: skip
    run("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
        "-CAcreateserial", "-out", str(cert), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return Certs(ca=ca, cert=cert, key=key)
