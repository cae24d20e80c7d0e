"""What applications ask of the running agent: its status, waits for what happens,
notifications to listen to, requests to the broker, publishes.

:class:`Applications` is the part of :class:`~mdeci.agent.aio.Agent` the local API
(:mod:`mdeci.agent.api`) and embedding programs call. Each request is the core's (it
numbers it and sends the frame); the glue waits on a future that the core's
``RequestDone`` / ``RequestFailed`` event resolves.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from mdeci.agent.backend import SipBackend
from mdeci.agent.core import AgentCore
from mdeci.agent.errors import AgentError, BrokerRefused, NotConnected
from mdeci.agent.events import hostport
from mdeci.agent.machine import Status
from mdeci.agent.sms import SmsInbox
from mdeci.agent.state import StateFiles
from mdeci.agent.status import AgentStatus, PubResult
from mdeci.agent.subscriptions import SubState
from mdeci.config import AgentConfig
from mdeci.frames import (
    AttrValue,
    CalendarOk,
    CalendarRule,
    Error,
    Frame,
    LimitReached,
    Pub,
    PubOk,
    SubInfo,
    SubOk,
    Subs,
    encode,
)
from rudp.aio import RudpEndpoint


class Applications:
    """The applications' calls on the agent (a part of :class:`~mdeci.agent.aio.Agent`,
    which owns the state named below)."""

    config: AgentConfig
    clock: Callable[[], float]
    monotonic: Callable[[], float]
    core: AgentCore | None
    sms: SmsInbox | None
    _files: StateFiles | None
    _changed: asyncio.Event
    _waiters: dict[int, asyncio.Future[Frame]]
    _listeners: set[asyncio.Queue[dict[str, Any]]]
    _sync_soon: bool
    _connected: asyncio.Event
    recent_events: deque[dict[str, Any]]
    endpoint: RudpEndpoint | None
    backend: SipBackend | None

    def _pump(self) -> None:
        """Carry out the core's commands (the agent's)."""
        raise NotImplementedError

    def _sync_outbox(self) -> None:
        """The outbox's durable point for this loop turn (the agent's)."""
        raise NotImplementedError

    # ------------------------------------------------------------------ observing

    @property
    def status_value(self) -> Status:
        return self.core.status if self.core is not None else Status.DISCONNECTED

    @property
    def connected(self) -> bool:
        return self.core is not None and self.core.connected

    @property
    def subscriptions(self) -> tuple[SubInfo, ...]:
        return self.core.subscriptions if self.core is not None else ()

    @property
    def subscription_states(self) -> tuple[SubState, ...]:
        """Recorded subscriptions (live, or pending: being subscribed again), then the
        latest ended ones, each with its lease and state."""
        return self.core.subs.states() if self.core is not None else ()

    @property
    def last_error(self) -> str | None:
        return self.core.last_error if self.core is not None else None

    async def wait_connected(self) -> None:
        """Return once the session is CONNECTED."""
        await self._connected.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        """Return once ``predicate()`` holds; checked after each event of the core."""
        while not predicate():
            self._changed.clear()
            await self._changed.wait()

    async def wait_event(self, event: str, count: int = 1, **match: object) -> dict[str, Any]:
        """The ``count``-th recent churn record named ``event`` (whose fields equal ``match``)."""
        found: list[dict[str, Any]] = []

        def seen() -> bool:
            found[:] = [
                r
                for r in self.recent_events
                if r["event"] == event and all(r.get(k) == v for k, v in match.items())
            ]
            return len(found) >= count

        await self.wait_until(seen)
        return found[count - 1]

    def status(self) -> AgentStatus:
        """A snapshot for ``mdeci status``."""
        core, files, endpoint, backend = self.core, self._files, self.endpoint, self.backend
        assert core is not None and files is not None and endpoint is not None
        assert backend is not None
        return AgentStatus(
            aor=self.config.aor,
            node=self.config.node,
            status=core.status,
            state=str(core.state),
            sip_addr=hostport(core.sip_addr),
            media_addr=hostport(endpoint.local_addr),
            broker_media_addr=None if core.broker_media is None else hostport(core.broker_media),
            media_transport=core.media_transport,
            call_id=core.call_id,
            registered=core.registered,
            highest_nseq=files.nseq.highest,
            store_id=files.nseq.store_id,
            buffered=len(files.outbox),
            inbox=len(files.inbox.records),
            listeners=len(self._listeners),
            subscriptions=len(core.subscriptions),
            attempts=core.counters.attempts,
            failed_attempts=core.counters.failed_attempts,
            alerts=dict(core.counters.alerts),
            last_error=core.last_error,
            sip_stack=backend.name,
            sip_transport=backend.transport,
            sip_received=backend.received,
            sip_contact=backend.contact,
        )

    # ------------------------------------------------------------------ requests

    def listen(self) -> asyncio.Queue[dict[str, Any]]:
        """A queue that receives every notification handed over from now on."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._listeners.add(queue)
        self._changed.set()
        return queue

    def unlisten(self, queue: asyncio.Queue[dict[str, Any]]) -> None:
        self._listeners.discard(queue)
        self._changed.set()

    def delivered_since(self, nseq: int) -> list[dict[str, Any]]:
        """Notifications kept in the inbox with ``nseq >= nseq``."""
        assert self._files is not None
        return self._files.inbox.since(nseq)

    async def _answer(self, req: int, timeout: float | None = None) -> Frame:
        future: asyncio.Future[Frame] = asyncio.get_running_loop().create_future()
        self._waiters[req] = future
        self._pump()
        try:
            if timeout is None:
                reply = await future
            else:
                reply = await asyncio.wait_for(asyncio.shield(future), timeout)
        finally:
            if self._waiters.get(req) is future:
                if not future.done():
                    future.cancel()
                del self._waiters[req]
        if isinstance(reply, Error):
            raise BrokerRefused(reply.code, reply.message)
        return reply

    @property
    def limits(self) -> list[LimitReached]:
        """The usage limits the broker told us of (``limit`` frames)."""
        return [] if self.core is None else list(self.core.limits)

    async def subscribe(
        self,
        subject: str,
        filter: str = "",
        ttl: int | None = None,
        *,
        qclass: str = "",
        lease: bool = True,
        in_order: bool = False,
    ) -> SubOk:
        """Subscribe (``qclass``: the queue class of its notifications; ``lease``: the
        agent renews it until it is cancelled, else it ends at its TTL; ``in_order``: its
        notifications keep their order, docs/channels.md "The order"). Raises
        :class:`NotConnected`, :class:`BrokerRefused`, :class:`~mdeci.errors.FrameError`
        (bad subject)."""
        assert self.core is not None
        req = self.core.subscribe(
            self.monotonic(), subject, filter, ttl, qclass=qclass, fixed=not lease,
            in_order=in_order,
        )  # fmt: skip
        reply = await self._answer(req)
        if not isinstance(reply, SubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to sub")
        return reply

    async def send_calendar(
        self, rules: Sequence[CalendarRule], utc_offset_minutes: int = 0
    ) -> CalendarOk:
        """Tell the broker this device's weekly channel calendar (it decides how
        long a notification may wait for a better channel). Raises :class:`NotConnected`,
        :class:`BrokerRefused`, :class:`~mdeci.errors.FrameError` (bad rules)."""
        assert self.core is not None
        req = self.core.send_calendar(self.monotonic(), rules, utc_offset_minutes)
        reply = await self._answer(req)
        if not isinstance(reply, CalendarOk):
            raise AgentError(f"unexpected answer {reply.op!r} to calendar")
        return reply

    async def unsubscribe(self, sub_id: str) -> None:
        """Cancel ``sub_id``. Raises :class:`NotConnected`, :class:`BrokerRefused`."""
        assert self.core is not None
        await self._answer(self.core.unsubscribe(self.monotonic(), sub_id))

    async def list_subscriptions(self) -> tuple[SubInfo, ...]:
        """Ask the broker for our subscriptions. Raises :class:`NotConnected`."""
        assert self.core is not None
        reply = await self._answer(self.core.list(self.monotonic()))
        if not isinstance(reply, Subs):
            raise AgentError(f"unexpected answer {reply.op!r} to list")
        return reply.items

    async def publish(
        self,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes = b"",
        *,
        urgent: bool = False,
        qclass: str = "",
        timeout: float | None = None,
    ) -> PubResult:
        """Publish: buffered durably first, then sent if CONNECTED.

        Returns within ``timeout`` (None: when the broker answered or the core gave up,
        ``response_timeout``; the local API passes ``pub_timeout``): ``published`` (the
        broker's ``pub-ok`` came), ``sent`` (no answer yet: it stays buffered until one
        comes, and is sent again with its ``msg_id`` once the broker is heard from, or
        after a reconnection) or ``buffered`` (DISCONNECTED).
        Raises :class:`~mdeci.errors.FrameError` for a bad subject or attributes,
        :class:`BrokerRefused` if the broker refused it, :class:`StateError`.
        """
        assert self.core is not None
        msg_id, req = self.core.publish(
            self.monotonic(), subject, attrs, payload, urgent=urgent, qclass=qclass,
            wall=self.clock(),
        )  # fmt: skip
        if req is not None and not self._sync_soon:
            # One fsync for the publishes of this loop turn, then they are sent.
            self._sync_soon = True
            asyncio.get_running_loop().call_soon(self._sync_outbox)
        if req is None:
            self._pump()
            if msg_id in self.core.waiting_publishes:
                return PubResult(msg_id=msg_id, state="held")  # for a cheaper network
            self._publish_by_sms(msg_id, subject, attrs, payload, urgent)
            return PubResult(msg_id=msg_id, state="buffered")
        try:
            reply = await self._answer(req, timeout)
        except TimeoutError:
            self.core.stop_awaiting(req)  # told pending: a later refusal keeps it
            return PubResult(msg_id=msg_id, state="sent")
        except NotConnected:
            self._publish_by_sms(msg_id, subject, attrs, payload, urgent)
            return PubResult(msg_id=msg_id, state="buffered")
        if not isinstance(reply, PubOk):
            raise AgentError(f"unexpected answer {reply.op!r} to pub")
        return PubResult(msg_id=msg_id, state="published", matched=reply.matched)

    def _publish_by_sms(
        self,
        msg_id: str,
        subject: str,
        attrs: Mapping[str, AttrValue] | None,
        payload: bytes,
        urgent: bool,
    ) -> None:
        """IP is down: an urgent publish also goes by SMS now (``[sms] publish_urgent``);
        the IP resend later carries the same ``msg_id``, which the broker takes once."""
        if urgent and self.sms is not None and self.config.sms.publish_urgent:
            frame = Pub(
                req=0,
                msg_id=msg_id,
                subject=subject,
                attrs=dict(attrs or {}),
                payload=payload,
                urgent=True,
            )
            self.sms.send_frame(encode(frame))
