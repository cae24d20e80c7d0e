"""An asyncio client library for applications on a device running ``mdeci agent``.

It speaks the agent's JSON-lines API (docs/agent.md "Local API"), which stays the
language-neutral contract; this package adds typed results and errors, and a cursor that
lets an application acknowledge what it finished and resume there after a crash::

    from mdeci.client import Client, FileCursor

    async with Client("var/agent/api.sock") as client:
        stream = await client.notifications(FileCursor("var/app/cursor.json"))
        await client.ensure_subscription("stocks.*", "Price < 25")
        result = await client.publish("stocks.petr4", {"Price": 24.5}, "buy")
        async for note in stream:
            handle(note)
            await stream.ack(note)
"""

from __future__ import annotations

from mdeci.client.connection import Client, Notifications, SubscriptionEvents
from mdeci.client.cursor import FileCursor, Position
from mdeci.client.errors import (
    AgentUnavailable,
    BadRequest,
    ClientError,
    CursorError,
    NotConnected,
    ProtocolError,
    Refused,
)
from mdeci.client.protocol import (
    Notification,
    PublishResult,
    PublishState,
    Subscription,
    SubscriptionEvent,
)

__all__ = [
    "AgentUnavailable",
    "BadRequest",
    "Client",
    "ClientError",
    "CursorError",
    "FileCursor",
    "NotConnected",
    "Notification",
    "Notifications",
    "Position",
    "ProtocolError",
    "PublishResult",
    "PublishState",
    "Refused",
    "Subscription",
    "SubscriptionEvent",
    "SubscriptionEvents",
]
