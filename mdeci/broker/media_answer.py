"""The broker's side of the data channel's offer/answer (docs/sip.md), sans-IO: which
offered line it accepts and the answer it writes.

``[media] transports`` names the data channels the broker accepts (``"rudp"``,
``"quic"``). Of an offer's mdeci lines the first of an accepted transport is taken (the
offer's order is the agent's preference, RFC 3264 §6), every other line refused with
port 0; an offer with none is answered 488 (:class:`sip.errors.SdpError`). An accepted
RUDP line gets the RUDP endpoint's address, a QUIC line the QUIC server's and its
certificate's fingerprint (``a=fingerprint:sha-256``, RFC 8122). The answer also names
the store's incarnation (``a=mdeci-store``, docs/agent.md).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from sip.sdp import MdeciMedia, SessionDescription, build_answer, parse_session

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class DataChannels:
    """What the broker answers with: the transports it accepts, in no order of its own
    (the offer's order decides), the RUDP address, and the QUIC server's address and
    certificate fingerprint (None when QUIC is not accepted)."""

    accept: tuple[str, ...]
    rudp: Address
    quic: Address | None = None
    fingerprint: bytes | None = None

    def __post_init__(self) -> None:
        if "quic" in self.accept and (self.quic is None or self.fingerprint is None):
            raise ValueError("accepting QUIC needs the QUIC server's address and fingerprint")


def with_store_id(answer: str, store_id: str) -> str:
    """The answer with ``a=mdeci-store:<id>`` at session level (docs/agent.md): agents
    reset their delivery gate when the store they talk to is a new one."""
    head, sep, rest = answer.partition("m=")
    return f"{head}a=mdeci-store:{store_id}\r\n{sep}{rest}"


def read_offer(body: bytes | str | SessionDescription, channels: DataChannels) -> MdeciMedia:
    """The offer's line the broker accepts (``transport`` names it). Raises
    :class:`~sip.errors.SdpError` (488) when no line of an accepted transport is usable,
    or the offer is unreadable or has no key-exchange value."""
    return parse_session(body, require_key=True, transports=channels.accept)


def answer_offer(
    body: bytes | str | SessionDescription,
    user: str,
    origin: tuple[int, int],
    channels: DataChannels,
    key: bytes | None,
    store_id: str,
) -> str:
    """The answer to ``body`` from ``user`` with the SDP ``origin`` (sess-id, version):
    the accepted line on its transport's address, our key-exchange ``key`` (None: the
    session keeps its keys). Raises :class:`~sip.errors.SdpError` (488)."""
    quic = channels.quic
    return with_store_id(
        build_answer(
            body,
            user,
            *origin,
            *channels.rudp,
            key=key,
            accept=channels.accept,
            quic_port=None if quic is None else quic[1],
            fingerprint=channels.fingerprint,
        ),
        store_id,
    )


def sess_id(salt: bytes, call_id: str, from_tag: str) -> int:
    """The o= sess-id of a dialog's answers: the same for all of them, as RFC 3264 §8
    asks, with none kept per session. ``salt`` is the process's random one: a dialog
    answered again after a restart (its versions are gone) gets another."""
    text = f"{call_id}\0{from_tag}".encode()  # neither holds a NUL (RFC 3261 §25.1)
    digest = hashlib.blake2b(text, digest_size=6, key=salt).digest()
    return int.from_bytes(digest, "big") & 0x7FFFFFFFFFFF
