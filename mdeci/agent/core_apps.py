"""The applications' inputs of :class:`~mdeci.agent.core.AgentCore`: subscribe,
calendar, unsubscribe, list, publish (a mixin: the core's state, its requests and
subscriptions, are the core's)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from mdeci.agent.device import DeviceSide
from mdeci.agent.errors import NotConnected
from mdeci.agent.requests import Requests
from mdeci.agent.subscriptions import SubsBook
from mdeci.frames import AttrValue, Calendar, CalendarRule, List


class ApplicationInputs:
    """What applications ask of the core (see :class:`~mdeci.agent.core.AgentCore`)."""

    _connected: bool
    _requests: Requests
    _subs: SubsBook
    _wall_offset: float  # wall clock minus the core's monotonic one, as last seen
    device: DeviceSide
    random_bytes: Callable[[int], bytes]

    def _need_connection(self) -> None:
        if not self._connected:
            raise NotConnected("not connected to the broker (requests are refused)")

    def subscribe(
        self,
        now: float,
        subject: str,
        filter: str = "",
        ttl: int | None = None,
        *,
        qclass: str = "",
        fixed: bool = False,
        in_order: bool = False,
    ) -> int:
        """Send ``sub`` (``qclass``: the queue class of its notifications; ``fixed``: it
        ends at its TTL, else it is a lease the agent renews); its ``req``. Raises
        :class:`NotConnected`, :class:`FrameError`."""
        self._need_connection()
        return self._subs.subscribe(
            now, subject, filter, ttl, qclass, fixed=fixed, in_order=in_order
        )

    def send_calendar(
        self, now: float, rules: Sequence[CalendarRule], utc_offset_minutes: int = 0
    ) -> int:
        """Send this device's channel calendar; its ``req``. It is also the agent's own
        from now on (:meth:`DeviceSide.use_calendar`). Raises :class:`NotConnected`,
        :class:`FrameError` (bad rules)."""
        self._need_connection()
        req = self._requests.next_req()
        frame = Calendar(req=req, rules=tuple(rules), utc_offset_minutes=utc_offset_minutes)
        self.device.use_calendar(frame)
        return self._requests.request(now, frame)

    def unsubscribe(self, now: float, sub_id: str) -> int:
        """Send ``unsub``; its ``req``. Raises :class:`NotConnected`, :class:`FrameError`."""
        self._need_connection()
        return self._subs.unsubscribe(now, sub_id)

    def list(self, now: float) -> int:
        """Send ``list``; its ``req``. Raises :class:`NotConnected`."""
        self._need_connection()
        return self._requests.request(now, List(req=self._requests.next_req()))

    def publish(
        self,
        now: float,
        subject: str,
        attrs: Mapping[str, AttrValue] | None = None,
        payload: bytes = b"",
        *,
        urgent: bool = False,
        qclass: str = "",
        wall: float | None = None,
    ) -> tuple[str, int | None]:
        """Buffer durably, then send if CONNECTED and not waiting for a cheaper network
        (``qclass``, :mod:`mdeci.agent.device`): ``(msg_id, req or None)``.

        Raises :class:`~mdeci.errors.FrameError` (bad subject or attributes; nothing
        stored), :class:`StateError`.
        """
        msg_id = self.random_bytes(16).hex()
        if wall is not None:
            self._wall_offset = wall - now
        req = self._requests.publish(
            now,
            msg_id,
            subject,
            attrs,
            payload,
            urgent=urgent,
            connected=self._connected,
            qclass=qclass,
            wall=now + self._wall_offset,
        )
        return msg_id, req

    @property
    def waiting_publishes(self) -> tuple[str, ...]:
        """The msg_ids of the publishes that wait for a cheaper network."""
        return self._requests.waiting

    def stop_awaiting(self, req: int) -> None:
        """The application was told publish ``req`` is pending (its wait ended)."""
        self._requests.stop_awaiting(req)

    def sync_outbox(self, now: float) -> None:
        """The glue's durable point for publishes (once per loop turn): one fsync for the
        publishes buffered since the last one, then they are sent, in order."""
        self._requests.sync()
