"""Reliable UDP for mdeci's data channel: sans-IO core with an asyncio adapter in ``rudp.aio``."""

from rudp.config import RudpConfig
from rudp.connection import (
    ConnectionState,
    MessageAcked,
    MessageFailed,
    MessageReceived,
    PeerDisconnected,
    RudpConnection,
    RudpStats,
    derive_connection_id,
)
from rudp.errors import MessageTooLarge, PacketError, PeerUnreachable, RudpError

__all__ = [
    "ConnectionState",
    "MessageAcked",
    "MessageFailed",
    "MessageReceived",
    "MessageTooLarge",
    "PacketError",
    "PeerDisconnected",
    "PeerUnreachable",
    "RudpConfig",
    "RudpConnection",
    "RudpError",
    "RudpStats",
    "derive_connection_id",
]
