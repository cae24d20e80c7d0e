"""The agent's session keys and SDP: creation of the offer, reading of the answer.

Kept in one place on purpose. The key exchange (docs/security.md): the offer carries an
ephemeral X25519 public value ``a=mdeci-kx``, the broker answers with its own, and both
derive the RUDP session secret from the exchange, the user's SHA-256 HA1 and both SDP
bodies (:mod:`rudp.keys`). No key ever travels in SDP.

The data channel (docs/sip.md): ``[media] transport`` names the one the agent offers,
``"rudp"`` or ``"quic"``, or ``"auto"``: both lines, QUIC first (:func:`offered_transports`).
The answer accepts one of them (RFC 3264 §6); :meth:`SessionKeys.read_answer` takes the
accepted line, and refuses an answer that accepts a transport we did not offer or a QUIC
line without the broker certificate's fingerprint. The QUIC line's port is our media
port: informative only (the agent is QUIC's client, and its connection leaves from a
socket of its own).

The broker announces its store incarnation in the answer as a session-level attribute
``a=mdeci-store:<id>`` (ignored by parsers that do not know it, RFC 4566 §5.13); an agent
that sees a new id knows the broker's queues and ``nseq`` numbering started over.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from mdeci.agent.events import AttachMedia
from mdeci.config import AgentConfig
from rudp.keys import KeyExchange, KeyExchangeError, psk_from_ha1
from sip.auth import compute_ha1
from sip.errors import SdpError
from sip.sdp import build_offer, parse_session

KEY_BYTES = 32
STORE_ATTRIBUTE = "mdeci-store"


def new_key_exchange(random_bytes: Callable[[int], bytes]) -> KeyExchange:
    """A fresh ephemeral X25519 pair; its public value goes in our offers."""
    return KeyExchange(random_bytes(KEY_BYTES))


def session_psk(user: str, realm: str, password: str) -> bytes:
    """The pre-shared secret the key agreement binds to: the user's SHA-256 HA1."""
    return psk_from_ha1(compute_ha1(user, realm, password, "SHA-256"))


AUTO = "auto"
# What "auto" offers, in the order of our preference: QUIC's congestion control and
# stream are worth having where the broker takes it; RUDP where it does not.
AUTO_ORDER = ("quic", "rudp")


def offered_transports(choice: str) -> tuple[str, ...]:
    """The data channels an agent configured with ``[media] transport = choice`` offers,
    in the order of its preference. Raises :class:`ValueError` for an unknown choice."""
    if choice == AUTO:
        return AUTO_ORDER
    if choice in AUTO_ORDER:
        return (choice,)
    raise ValueError(f"transport is one of rudp, quic, auto, not {choice!r}")


def session_offer(
    user: str,
    sess_id: str,
    version: int,
    media: tuple[str, int],
    public: bytes,
    msisdn: str | None,
    transports: Sequence[str] = ("rudp",),
) -> bytes:
    """Our offer: a line per transport on the address ``media`` (docstring above) with
    our key-exchange ``public`` value."""
    host, port = media
    return build_offer(
        user, sess_id, version, host, port, public, msisdn,
        transports=transports, quic_port=port if "quic" in transports else None,
    ).encode()  # fmt: skip


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
    transport: str = "rudp"  # the data channel the broker accepted
    fingerprint: bytes | None = None  # its certificate's SHA-256 (QUIC only)

    def attach(self, key: bytes) -> AttachMedia:
        """The command that opens (or keeps) the data channel to the broker."""
        return AttachMedia(key, self.media, transport=self.transport, fingerprint=self.fingerprint)


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


def read_answer(body: bytes, offered: Sequence[str] = ("rudp",)) -> Answer:
    """The broker's media address, store id, key-exchange value and the data channel it
    accepted among ``offered``. Raises :class:`SdpError` (also for a QUIC line without a
    fingerprint: nothing would tell its certificate from another's)."""
    media = parse_session(body, transports=offered)
    if media.transport == "quic" and media.fingerprint is None:
        raise SdpError("the accepted QUIC line has no a=fingerprint:sha-256")
    return Answer(
        media=(media.addr, media.port),
        store_id=store_id_of(body),
        public=media.key,
        transport=media.transport,
        fingerprint=media.fingerprint,
    )


class SessionKeys:
    """Our side of the key exchange across the offers of one agent's life.

    A new session, and a re-INVITE after the media failed, offer a fresh value; a
    re-INVITE of a move offers the same one and keeps the keys unless the answer
    carries a new value.
    """

    def __init__(
        self,
        user: str,
        realm: str,
        password: str,
        msisdn: str | None,
        random_bytes: Callable[[int], bytes],
        transport: str = "rudp",
    ) -> None:
        self.transports = offered_transports(transport)  # raises ValueError
        self._user = user
        self._realm = realm
        self._password = password
        self._msisdn = msisdn
        self._random_bytes = random_bytes
        self.key: bytes | None = None  # the RUDP session secret (rudp.keys)
        self._kx: KeyExchange | None = None  # our exchange; its public value is offered
        self._fresh = False  # the offer in flight carries a new value: the answer must too
        self.offered = b""  # the offer in flight (the key agreement binds both bodies)
        self._version = 0
        self._sess_id = str(int.from_bytes(random_bytes(4), "big"))

    @classmethod
    def of(cls, config: AgentConfig, random_bytes: Callable[[int], bytes]) -> SessionKeys:
        """The keys of the agent ``config`` describes (its user, realm, password, number
        and ``[media] transport``)."""
        user = config.aor.split(":", 1)[1].split("@", 1)[0]
        realm = config.broker.realm or config.broker.aor.rsplit("@", 1)[1]
        return cls(
            user, realm, config.password, config.msisdn, random_bytes, config.media.transport
        )

    def offer(self, media: tuple[str, int], *, new_keys: bool = False) -> bytes:
        """Our next offer; ``new_keys``: with a fresh key exchange."""
        if new_keys or self._kx is None:
            self._kx = new_key_exchange(self._random_bytes)
            self._fresh = True
        else:
            self._fresh = False
        self._version += 1
        self.offered = session_offer(
            self._user,
            self._sess_id,
            self._version,
            media,
            self._kx.public,
            self._msisdn,
            self.transports,
        )
        return self.offered

    def read_answer(self, body: bytes) -> Answer:
        """The broker's answer to our offers (:func:`read_answer`). Raises SdpError."""
        return read_answer(body, self.transports)

    def agree(self, answer: Answer, offer: bytes, body: bytes) -> str | None:
        """Take the keys of the broker's ``answer`` to ``offer``: None, or why it gives
        none."""
        if answer.public is None:
            if self._fresh or self.key is None:
                return "the broker's answer has no a=mdeci-kx"
            return None  # a re-INVITE keeping the keys
        assert self._kx is not None
        psk = session_psk(self._user, self._realm, self._password)
        try:
            self.key = agree(self._kx, answer.public, psk, offer, body)
        except KeyAgreementError as exc:
            return str(exc)
        return None
