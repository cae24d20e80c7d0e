"""The key schedule for tests that act as an agent or as a broker (docs/security.md §3).

Real X25519 and HKDF (``rudp.keys``), as the agent and the broker run them: a test
device offers ``public`` and derives its RUDP session secret from the answer.
"""

from __future__ import annotations

import secrets

from rudp.keys import KeyExchange, psk_from_ha1
from sip.auth import compute_ha1


def psk(user: str, realm: str, password: str) -> bytes:
    """The pre-shared secret of ``user``: its SHA-256 HA1."""
    return psk_from_ha1(compute_ha1(user, realm, password, "SHA-256"))


class OfferKeys:
    """One side's ephemeral exchange for one offer/answer."""

    def __init__(self, user: str, realm: str, password: str) -> None:
        self._kx = KeyExchange(secrets.token_bytes(32))
        self.public = self._kx.public
        self._psk = psk(user, realm, password)

    def secret(self, peer_public: bytes, offer: bytes, answer: bytes) -> bytes:
        """The session secret both ends derive."""
        return self._kx.session_secret(peer_public, self._psk, offer, answer)
