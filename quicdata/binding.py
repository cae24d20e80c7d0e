"""What ties a QUIC connection to the SIP session (docs/security.md "QUIC"): the broker's
self-signed certificate and its fingerprint, and the key proof both ends exchange first
on the stream.

The proof. TLS alone would let an on-path party that rewrote the SDP (fingerprint
included) terminate QUIC with its own certificate. So both ends prove, inside the
connection, that they hold the session secret of the SIP key agreement (``rudp.keys``):

    binding = HMAC-SHA256(client 1-RTT traffic secret, "mdeci quic binding")
    client -> server: session id (8 bytes) || HMAC-SHA256(K_client, binding)
    server -> client: HMAC-SHA256(K_server, binding)

``K_client``, ``K_server`` and the session id are HKDF-SHA256 outputs of the session
secret with their own labels. aioquic 1.x has no TLS exporter (RFC 8446 §7.5), so the
binding is derived from the client's application traffic secret, which only the two
TLS ends of this one connection know (it is read from aioquic's key log hook, in
memory). A party in the middle runs two TLS connections with two different secrets:
a proof it relays fails, and it cannot make one without the session secret. The
session id (not secret: it names the session, as RUDP's connection id does) tells the
broker which key to check the proof with.

Sans-IO: the clock's time is given; cryptography draws the certificate's key itself.
"""

from __future__ import annotations

import datetime
import hashlib
import hmac

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.hkdf import HKDF
from cryptography.x509.oid import NameOID

__all__ = [
    "PROOF_BYTES",
    "SESSION_ID_BYTES",
    "ProofKeys",
    "ServerCertificate",
    "binding_value",
    "fingerprint",
    "format_fingerprint",
    "parse_fingerprint",
]

SESSION_ID_BYTES = 8
PROOF_BYTES = 32
ALPN = "mdeci"


def _derive(secret: bytes, label: bytes, length: int) -> bytes:
    return HKDF(algorithm=hashes.SHA256(), length=length, salt=None, info=label).derive(secret)


class ProofKeys:
    """The proof keys and the session id of one session secret."""

    __slots__ = ("client", "server", "session_id")

    def __init__(self, session_secret: bytes) -> None:
        if len(session_secret) != 32:
            raise ValueError("a session secret is 32 bytes")
        self.client = _derive(session_secret, b"mdeci quic proof client", 32)
        self.server = _derive(session_secret, b"mdeci quic proof server", 32)
        self.session_id = _derive(session_secret, b"mdeci quic session id", SESSION_ID_BYTES)

    def client_proof(self, binding: bytes) -> bytes:
        return self.session_id + hmac.digest(self.client, binding, "sha256")

    def server_proof(self, binding: bytes) -> bytes:
        return hmac.digest(self.server, binding, "sha256")

    def check_client(self, proof: bytes, binding: bytes) -> bool:
        return hmac.compare_digest(proof, self.client_proof(binding))

    def check_server(self, proof: bytes, binding: bytes) -> bool:
        return hmac.compare_digest(proof, self.server_proof(binding))


def binding_value(client_traffic_secret: bytes) -> bytes:
    """The connection's binding (module docstring)."""
    return hmac.digest(client_traffic_secret, b"mdeci quic binding", "sha256")


def fingerprint(certificate: x509.Certificate) -> bytes:
    """SHA-256 over the certificate's DER (RFC 8122 §5)."""
    return hashlib.sha256(certificate.public_bytes(serialization.Encoding.DER)).digest()


def format_fingerprint(digest: bytes) -> str:
    """``AB:CD:...``, as ``a=fingerprint:sha-256`` writes it (RFC 8122 §5)."""
    return ":".join(f"{b:02X}" for b in digest)


def parse_fingerprint(text: str) -> bytes:
    """The 32 bytes of an ``AB:CD:...`` SHA-256 fingerprint. Raises ValueError."""
    parts = text.strip().split(":")
    if len(parts) != 32 or any(len(p) != 2 for p in parts):
        raise ValueError("a sha-256 fingerprint is 32 colon-separated hex bytes")
    try:
        return bytes(int(p, 16) for p in parts)
    except ValueError:
        raise ValueError("a sha-256 fingerprint is 32 colon-separated hex bytes") from None


class ServerCertificate:
    """The broker's self-signed certificate (ECDSA P-256) and its key; its fingerprint
    goes in the SDP answer, where the agent checks it."""

    __slots__ = ("certificate", "fingerprint", "private_key")

    def __init__(self, certificate: x509.Certificate, private_key: ec.EllipticCurvePrivateKey):
        self.certificate = certificate
        self.private_key = private_key
        self.fingerprint = fingerprint(certificate)

    @classmethod
    def generate(
        cls, now: datetime.datetime, name: str = "mdeci-broker", days: int = 365
    ) -> ServerCertificate:
        """A new key and a certificate valid from an hour before ``now`` for ``days``."""
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        certificate = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))
            .not_valid_after(now + datetime.timedelta(days=days))
            .sign(key, hashes.SHA256())
        )
        return cls(certificate, key)
