"""The asyncio client of the local agent (``mdeci.client.Client``)."""

from __future__ import annotations

import asyncio
import base64
import contextlib
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Self

from mdeci.client.cursor import FileCursor, Position
from mdeci.client.errors import AgentUnavailable, ProtocolError
from mdeci.client.protocol import (
    Notification,
    PublishResult,
    Subscription,
    SubscriptionEvent,
    check,
    decode,
    encode,
    notification,
    publish_result,
    subscription,
    subscription_event,
)

MAX_LINE = 4 << 20  # the agent's own limit on a line (a payload travels base64 in it)
AttrValue = str | int | float | bool


async def _open(path: Path) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.open_unix_connection(path, limit=MAX_LINE)
    except OSError:
        raise AgentUnavailable(
            f"cannot reach the agent at {path}: is `mdeci agent` running?"
        ) from None


async def _readline(reader: asyncio.StreamReader) -> dict[str, Any]:
    try:
        line = await reader.readline()
    except (OSError, ValueError) as exc:
        raise AgentUnavailable(f"agent connection failed: {exc}") from None
    return decode(line)


class Client:
    """One application's connection to the agent's API socket (an async context manager).

    Requests go one at a time over one connection; :meth:`notifications` opens a second one
    for its stream. Errors are :mod:`mdeci.client.errors` classes.
    """

    def __init__(self, socket: Path | str) -> None:
        self.socket = Path(socket)
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._lock = asyncio.Lock()

    async def __aenter__(self) -> Client:
        await self.connect()
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def connect(self) -> None:
        """Open the request connection. Raises :class:`AgentUnavailable`."""
        if self._writer is None:
            self._reader, self._writer = await _open(self.socket)

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()
        self._reader = self._writer = None

    async def request(self, request: dict[str, Any]) -> dict[str, Any]:
        """Send one request object and return its ``ok`` answer (any op of docs/agent.md).

        Raises :class:`AgentUnavailable`, :class:`NotConnected`, :class:`Refused`,
        :class:`BadRequest`, :class:`ProtocolError`.
        """
        await self.connect()
        assert self._reader is not None and self._writer is not None
        async with self._lock:
            try:
                self._writer.write(encode(request))
                await self._writer.drain()
            except (OSError, ConnectionError) as exc:
                await self.close()
                raise AgentUnavailable(f"agent connection failed: {exc}") from None
            try:
                answer = await _readline(self._reader)
            except AgentUnavailable:
                await self.close()
                raise
        return check(answer)

    async def status(self) -> dict[str, Any]:
        """The agent's status object (``status``: CONNECTED or DISCONNECTED, ...)."""
        status = (await self.request({"op": "status"}))["status"]
        if not isinstance(status, dict):
            raise ProtocolError("status is not an object")
        return status

    async def subscribe(
        self,
        subject: str,
        filter: str = "",
        *,
        ttl: int | None = None,
        qclass: str = "",
        lease: bool = True,
        in_order: bool = False,
    ) -> Subscription:
        """Subscribe; ``ttl`` in seconds (None: the broker's default). With ``lease`` the
        agent renews it before each expiry until :meth:`unsubscribe`; ``lease=False``: it
        ends at its TTL. ``in_order``: its notifications keep their order (docs/channels.md
        "The order"). Either way its end is a :class:`SubscriptionEvent`
        (:meth:`subscription_events`). Raises :class:`NotConnected` while the agent is
        disconnected, :class:`Refused`."""
        answer = await self.request(
            {
                "op": "sub",
                "subject": subject,
                "filter": filter,
                "ttl": ttl,
                "qclass": qclass,
                "lease": lease,
                "in_order": in_order,
            }
        )
        return subscription({"lease": lease, **answer, "subject": subject, "filter": filter})

    async def subscriptions(self, *, ended: bool = False) -> list[Subscription]:
        """The user's subscriptions (the agent's cached list while it is disconnected);
        ``ended``: the latest ended ones too."""
        answer = await self.request({"op": "subs"})
        subs = [subscription(item) for item in answer.get("items", [])]
        return subs if ended else [s for s in subs if s.state != "ended"]

    async def ensure_subscription(
        self,
        subject: str,
        filter: str = "",
        *,
        ttl: int | None = None,
        qclass: str = "",
        lease: bool = True,
        in_order: bool = False,
    ) -> Subscription:
        """The live subscription with this subject and filter, made if there is none (an
        application restarting does not subscribe twice, which would notify it twice)."""
        for sub in await self.subscriptions():
            if sub.subject == subject and sub.filter == filter:
                return sub
        return await self.subscribe(
            subject, filter, ttl=ttl, qclass=qclass, lease=lease, in_order=in_order
        )

    async def subscription_events(self) -> SubscriptionEvents:
        """A stream of :class:`SubscriptionEvent` from now on (``async for``): each end of
        a subscription, and each replacement by a new ``sub_id``."""
        reader, writer = await _open(self.socket)
        writer.write(encode({"op": "tail"}))
        await writer.drain()
        return SubscriptionEvents(reader, writer)

    async def unsubscribe(self, sub_id: str) -> None:
        await self.request({"op": "unsub", "sub_id": sub_id})

    async def publish(
        self,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes | str = b"",
        *,
        urgent: bool = False,
        qclass: str = "",
    ) -> PublishResult:
        """Publish. The result's ``state`` says whether the broker accepted it or the agent
        keeps it to send later; a refusal raises :class:`Refused`."""
        data = payload.encode() if isinstance(payload, str) else payload
        answer = await self.request(
            {
                "op": "pub",
                "subject": subject,
                "attrs": dict(attrs or {}),
                "payload": base64.b64encode(data).decode(),
                "urgent": urgent,
                "qclass": qclass,
            }
        )
        return publish_result(answer)

    async def send_calendar(
        self, rules: Sequence[Mapping[str, object]], utc_offset_minutes: int = 0
    ) -> int:
        """Send the device's calendar of networks (maps of ``channel``, ``p``,
        ``weekdays`` bits, ``start_hour``, ``end_hour``, or for a dated rule ``start_at``
        and ``end_at`` in Unix seconds; docs/channels.md "Networks as channels"); how many
        rules the broker kept. It replaces agent.toml's ``[calendar]`` for the agent's
        life. A bad rule raises :class:`BadRequest` and nothing is sent."""
        answer = await self.request(
            {
                "op": "calendar",
                "rules": [dict(r) for r in rules],
                "utc_offset_minutes": utc_offset_minutes,
            }
        )
        return int(answer.get("rules", 0))

    async def notifications(self, cursor: FileCursor | None = None) -> Notifications:
        """A stream of notifications (``async for``).

        Without a cursor: those handed over from now on. With one: those after its position
        (kept ones first), acknowledged with :meth:`Notifications.ack`; a cursor that has
        no position yet starts after the agent's newest notification and is saved at once.
        """
        start: int | None = None
        store = ""
        if cursor is not None:
            status = await self.status()
            store = str(status.get("store_id") or "")
            position = cursor.position
            if position is None:
                position = Position(store, int(status.get("highest_nseq") or 0))
                await asyncio.to_thread(cursor.save, position, cursor.state)
            elif position.store != store:
                position = Position(store, 0)  # another store numbers from 1 again
                await asyncio.to_thread(cursor.save, position, cursor.state)
            start = position.nseq + 1
        reader, writer = await _open(self.socket)
        request: dict[str, Any] = {"op": "tail"}
        if start is not None:
            request["from"] = start
        writer.write(encode(request))
        await writer.drain()
        return Notifications(reader, writer, cursor, store)


class _Stream:
    """One API connection held open for a stream of lines; closed by :meth:`close` or on
    leaving ``async with``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


class SubscriptionEvents(_Stream):
    """The stream :meth:`Client.subscription_events` returns; close it (or ``async with``)."""

    def __aiter__(self) -> SubscriptionEvents:
        return self

    async def __anext__(self) -> SubscriptionEvent:
        while True:
            obj = await _readline(self._reader)
            event = obj.get("event")
            if isinstance(event, dict) and isinstance(event.get("subscription"), dict):
                return subscription_event(event["subscription"])
            if obj.get("ok") is False:
                check(obj)


class Notifications(_Stream):
    """The stream :meth:`Client.notifications` returns; close it (or use ``async with``)."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        cursor: FileCursor | None,
        store: str,
    ) -> None:
        super().__init__(reader, writer)
        self.cursor = cursor
        self._store = store
        self._last = cursor.position.nseq if cursor and cursor.position else 0

    def __aiter__(self) -> Notifications:
        return self

    async def __anext__(self) -> Notification:
        while True:
            obj = await _readline(self._reader)
            if "notify" in obj:
                note = notification(obj["notify"])
                if self.cursor is not None and note.nseq <= self._last:
                    continue  # already handed over on this stream
                self._last = note.nseq
                return note
            event = obj.get("event")
            if isinstance(event, dict) and "store_replaced" in event:
                # The broker numbers from 1 again; what the application acked stays acked.
                self._store = str(event["store_replaced"])
                self._last = 0
                if self.cursor is not None:
                    await asyncio.to_thread(
                        self.cursor.save, Position(self._store, 0), self.cursor.state
                    )
                continue
            if obj.get("ok") is False:
                check(obj)

    async def ack(self, note: Notification, state: Any = None) -> None:
        """Acknowledge ``note`` and every one before it, saving ``state`` with the ack in
        one durable write; after a restart the stream starts after it. Needs a cursor."""
        if self.cursor is None:
            raise ValueError("ack needs a stream opened with a cursor")
        await asyncio.to_thread(self.cursor.save, Position(self._store, note.nseq), state)
