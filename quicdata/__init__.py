"""QUIC (aioquic) as a data channel for our messages, beside ``rudp``.

The cores are sans-IO (``framing``, ``binding``, ``connection``, ``endpoint``: datagrams
and the clock in, datagrams and events out); ``quicdata.aio`` is the asyncio glue. Like
``rudp``, it carries opaque messages and knows nothing of mdeci's frames or SIP.
"""

from quicdata.binding import ServerCertificate, format_fingerprint, parse_fingerprint
from quicdata.connection import QuicDataClosed, QuicDataConfig, QuicDataConnection
from quicdata.events import Connected, MessageReceived, PathValidated, PeerDisconnected

__all__ = [
    "Connected",
    "MessageReceived",
    "PathValidated",
    "PeerDisconnected",
    "QuicDataClosed",
    "QuicDataConfig",
    "QuicDataConnection",
    "ServerCertificate",
    "format_fingerprint",
    "parse_fingerprint",
]
