"""What a :class:`quicdata.connection.QuicDataConnection` reports (``next_event``)."""

from __future__ import annotations

from dataclasses import dataclass

Address = tuple[str, int]


@dataclass(frozen=True, slots=True)
class Connected:
    """Both key proofs checked: messages flow from now on. ``session_id`` names the
    session (``quicdata.binding.ProofKeys.session_id``)."""

    session_id: bytes


@dataclass(frozen=True, slots=True)
class MessageReceived:
    data: bytes


@dataclass(frozen=True, slots=True)
class PeerDisconnected:
    """The connection is over: idle timeout (which is also how QUIC ends a path whose
    losses never recover), a failed proof or fingerprint, a close by either end."""

    reason: str


@dataclass(frozen=True, slots=True)
class PathValidated:
    """The peer's new address answered QUIC's path challenge: datagrams go there now."""

    address: Address
    previous: Address | None


QuicDataEvent = Connected | MessageReceived | PeerDisconnected | PathValidated
