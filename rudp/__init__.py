"""Reliable UDP for mdeci's data channel: sans-IO core with an asyncio adapter in ``rudp.aio``.

The names below are imported on first use (PEP 562): ``rudp.config`` alone, which every
configuration load needs, does not pull in the connection machinery (client start-up).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rudp.config import RudpConfig
    from rudp.connection import ConnectionState, RudpConnection, derive_connection_id
    from rudp.errors import MessageTooLarge, PacketError, PeerUnreachable, RudpError
    from rudp.events import (
        MessageAcked,
        MessageFailed,
        MessageReceived,
        PeerDisconnected,
        PeerRestarted,
        RudpStats,
    )

_WHERE = {
    "RudpConfig": "config",
    "ConnectionState": "connection",
    "MessageAcked": "events",
    "MessageFailed": "events",
    "MessageReceived": "events",
    "PeerDisconnected": "events",
    "PeerRestarted": "events",
    "RudpConnection": "connection",
    "RudpStats": "events",
    "derive_connection_id": "connection",
    "MessageTooLarge": "errors",
    "PacketError": "errors",
    "PeerUnreachable": "errors",
    "RudpError": "errors",
}

__all__ = [
    "ConnectionState",
    "MessageAcked",
    "MessageFailed",
    "MessageReceived",
    "MessageTooLarge",
    "PacketError",
    "PeerDisconnected",
    "PeerRestarted",
    "PeerUnreachable",
    "RudpConfig",
    "RudpConnection",
    "RudpError",
    "RudpStats",
    "derive_connection_id",
]


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'rudp' has no attribute {name!r}")
    return getattr(import_module(f"rudp.{module}"), name)
