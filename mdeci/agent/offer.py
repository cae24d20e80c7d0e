"""The agent's session keys and SDP: creation of the offer, reading of the answer.

Kept in one place on purpose. The key exchange (docs/security.md): the offer carries an
ephemeral X25519 public value ``a=mdeci-kx``, the broker answers with its own, and both
derive the RUDP session secret from the exchange, the user's SHA-256 HA1 and both SDP
bodies (:mod:`rudp.keys`). No key ever travels in SDP.

The broker announces its store incarnation in the answer as a session-level attribute
``a=mdeci-store:<id>`` (ignored by parsers that do not know it, RFC 4566 §5.13); an agent
that sees a new id knows the broker's queues and ``nseq`` numbering started over.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from rudp.keys import KeyExchange, KeyExchangeError, psk_from_ha1
from sip.auth import compute_ha1
from sip.sdp import build_offer, parse_session

KEY_BYTES = 32
STORE_ATTRIBUTE = "mdeci-store"


def new_key_exchange(random_bytes: Callable[[int], bytes]) -> KeyExchange:
    """A fresh ephemeral X25519 pair; its public value goes in our offers."""
    return KeyExchange(random_bytes(KEY_BYTES))


def session_psk(user: str, realm: str, password: str) -> bytes:
    """The pre-shared secret the key agreement binds to: the user's SHA-256 HA1."""
    return psk_from_ha1(compute_ha1(user, realm, password, "SHA-256"))


def session_offer(
    user: str,
    sess_id: str,
    version: int,
    media: tuple[str, int],
    public: bytes,
    msisdn: str | None,
) -> bytes:
    """Our offer: the RUDP address ``media`` and our key-exchange ``public`` value."""
    return build_offer(user, sess_id, version, media[0], media[1], public, msisdn).encode()


class KeyAgreementError(ValueError):
    """The broker's answer does not give a session secret (fail closed)."""


def agree(kx: KeyExchange, broker_public: bytes, psk: bytes, offer: bytes, answer: bytes) -> bytes:
    """The RUDP session secret from the broker's public value and both SDP bodies.

    Raises :class:`KeyAgreementError`.
    """
    try:
        return kx.session_secret(broker_public, psk, offer, answer)
    except KeyExchangeError as exc:
        raise KeyAgreementError(f"key exchange: {exc}") from None


@dataclass(frozen=True, slots=True)
class Answer:
    """What the agent reads from the broker's answer."""

    media: tuple[str, int]
    store_id: str | None
    public: bytes | None  # the broker's a=mdeci-kx; None: the current keys stay


def store_id_of(body: bytes) -> str | None:
    """The ``a=mdeci-store`` value of a session description, or None."""
    prefix = f"a={STORE_ATTRIBUTE}:"
    for raw in body.decode("utf-8", "replace").splitlines():
        line = raw.strip()
        if line.startswith("m="):
            return None  # session level only
        if line.startswith(prefix):
            value = line[len(prefix) :].strip()
            if 0 < len(value) <= 64 and value.isascii() and value.isprintable():
                return value
            return None
    return None


def read_answer(body: bytes) -> Answer:
    """The broker's media address, store id and key-exchange value. Raises
    :class:`SdpError`."""
    media = parse_session(body)
    return Answer(media=(media.addr, media.port), store_id=store_id_of(body), public=media.key)
