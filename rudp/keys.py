"""The session key schedule (docs/security.md §3): X25519 + a pre-shared secret -> HKDF.

Each new session, the offerer (agent) and the answerer (broker) each draw an
ephemeral X25519 key pair and put only the *public* value in their SDP
(``a=mdeci-kx``). Each side then computes::

    Z      = X25519(own private, peer public)                    32 bytes
    psk    = the user's SHA-256 digest HA1 (never on the wire)  32 bytes
    th     = SHA-256(len(offer) || offer || len(answer) || answer)   (u32 lengths)
    secret = HKDF-SHA256(salt = "mdeci-kx v1", ikm = Z || psk,
                         info = "mdeci session" || th, length = 32)

``secret`` is the RUDP session secret: :class:`rudp.RudpConnection` derives the
connection id and per-sender AEAD keys from it (``rudp.packet.key_iv``).

Why each input: Z gives forward secrecy (the private values live in memory for one
exchange only); psk binds the exchange to the user's password, so an on-path party
that replaces a public value computes a different secret than either end and every
datagram fails authentication (the session fails closed); th binds both full SDPs,
so any rewrite of either description yields a different secret too.

Sans-IO: the private value's 32 random bytes are injected.
"""

from __future__ import annotations

import hashlib
import struct

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

PUBLIC_BYTES = 32
SECRET_BYTES = 32
SALT = b"mdeci-kx v1"


class KeyExchangeError(ValueError):
    """A public value that cannot be used (wrong length, or a low-order point)."""


def transcript_hash(offer: bytes, answer: bytes) -> bytes:
    """SHA-256 over both session descriptions, length-prefixed (no ambiguity at the seam)."""
    h = hashlib.sha256()
    for part in (offer, answer):
        h.update(struct.pack("!I", len(part)))
        h.update(part)
    return h.digest()


def psk_from_ha1(ha1_hex: str) -> bytes:
    """The pre-shared secret: the user's SHA-256 HA1 (``H(user:realm:password)``) as bytes."""
    psk = bytes.fromhex(ha1_hex)
    if len(psk) != 32:
        raise KeyExchangeError("the pre-shared secret is a SHA-256 HA1 (32 bytes)")
    return psk


class KeyExchange:
    """One side's ephemeral X25519 key pair for one offer/answer exchange."""

    __slots__ = ("_private", "public")

    def __init__(self, private_bytes: bytes) -> None:
        if len(private_bytes) != 32:
            raise ValueError("an X25519 private value is 32 random bytes")
        self._private: X25519PrivateKey | None = X25519PrivateKey.from_private_bytes(private_bytes)
        self.public = self._private.public_key().public_bytes_raw()

    def session_secret(self, peer_public: bytes, psk: bytes, offer: bytes, answer: bytes) -> bytes:
        """The 32-byte session secret (module docstring). The private value is forgotten
        afterwards: one exchange, one use. Raises KeyExchangeError."""
        if self._private is None:
            raise KeyExchangeError("this key pair was used already")
        if len(peer_public) != PUBLIC_BYTES:
            raise KeyExchangeError(f"a public value is {PUBLIC_BYTES} bytes")
        try:
            shared = self._private.exchange(X25519PublicKey.from_public_bytes(peer_public))
        except ValueError:  # an all-zero result: a low-order point (RFC 7748 §6.1)
            raise KeyExchangeError("unusable public value (low-order point)") from None
        finally:
            self._private = None
        return HKDF(
            algorithm=hashes.SHA256(),
            length=SECRET_BYTES,
            salt=SALT,
            info=b"mdeci session" + transcript_hash(offer, answer),
        ).derive(shared + psk)


def public_tag(public: bytes) -> int:
    """A 64-bit digest of a public value, for a holder that needs only to tell values
    apart: two values share one by chance with probability 2^-64, and finding a value
    with a given one's tag is a second preimage of BLAKE2b."""
    return int.from_bytes(hashlib.blake2b(public, digest_size=8).digest(), "big")
