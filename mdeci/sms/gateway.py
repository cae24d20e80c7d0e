"""Gateways behind one interface, and the asyncio glue that runs an :class:`SmsLink`.

A gateway submits SMS (MT for the broker, MO for a phone) and hands every SMS it
receives to the callback given to :meth:`SmsGateway.start`. Implementations: the
embedded :class:`SimulatedGateway` (default), ``mdeci.sms.kannel.KannelGateway``
(sendsms HTTP out, get-url callback in) and ``mdeci.sms.smpp.SmppGateway`` (an ESME).
:class:`LinkRunner` feeds a link from a gateway on the event loop's clock.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from mdeci.sms.codec import Sms
from mdeci.sms.errors import GatewayError
from mdeci.sms.link import LinkEvent, SmsLink, SmsRefused
from mdeci.sms.smsc import SimulatedSmsc, SmscConfig

if TYPE_CHECKING:
    from mdeci.config import AgentSmsConfig, BrokerSmsConfig

SmsHandler = Callable[[Sms], None]

log = logging.getLogger(__name__)


class SmsGateway(Protocol):
    """Where SMS go out and come in."""

    async def start(self, on_sms: SmsHandler) -> None:
        """Begin receiving; ``on_sms`` is called on the event loop for each SMS."""
        ...

    async def send(self, sms: Sms) -> None:
        """Submit one SMS; raises :class:`~mdeci.sms.errors.GatewayError` if refused."""
        ...

    async def close(self) -> None: ...


class SimulatedNetwork:
    """A :class:`SimulatedSmsc` on the event loop's clock, routing by number."""

    def __init__(self, config: SmscConfig | None = None, *, seed: int | None = None) -> None:
        self.smsc = SimulatedSmsc(config or SmscConfig(), random.Random(seed))
        self._handlers: dict[str, SmsHandler] = {}
        self._timer: asyncio.TimerHandle | None = None

    def gateway(self, number: str) -> SimulatedGateway:
        return SimulatedGateway(self, number)

    def _attach(self, number: str, handler: SmsHandler) -> None:
        self._handlers[number] = handler

    def _detach(self, number: str) -> None:
        self._handlers.pop(number, None)

    def _submit(self, sms: Sms) -> None:
        loop = asyncio.get_running_loop()
        self.smsc.submit(sms, loop.time())
        self._arm(loop)

    def _arm(self, loop: asyncio.AbstractEventLoop) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        due = self.smsc.next_delivery()
        if due is not None:
            self._timer = loop.call_at(due, self._fire, loop)

    def _fire(self, loop: asyncio.AbstractEventLoop) -> None:
        self._timer = None
        for sms in self.smsc.deliver_due(loop.time()):
            handler = self._handlers.get(sms.recipient)
            if handler is not None:  # an unknown number: the SMSC drops it
                handler(sms)
        self._arm(loop)


class SimulatedGateway:
    """One number on a :class:`SimulatedNetwork` (the embedded default gateway)."""

    def __init__(self, network: SimulatedNetwork, number: str) -> None:
        self._network = network
        self.number = number

    async def start(self, on_sms: SmsHandler) -> None:
        self._network._attach(self.number, on_sms)

    async def send(self, sms: Sms) -> None:
        if sms.sender != self.number:
            raise GatewayError(f"{self.number} cannot send as {sms.sender}")
        self._network._submit(sms)

    async def close(self) -> None:
        self._network._detach(self.number)


class LinkRunner:
    """Runs an :class:`SmsLink` over a gateway; ``on_event`` gets every link event.

    The same shape as the RUDP adapter: feed the core, send what it says, re-arm one
    ``loop.call_at`` for its timer. Call :meth:`poke` after a command on the link
    (``send_frame``, ``cancel``) so its output goes out. Every SMS an authenticated link
    refuses is logged (warning) and handed to ``on_refused`` if given.
    """

    def __init__(
        self,
        link: SmsLink,
        gateway: SmsGateway,
        on_event: Callable[[LinkEvent], None],
        *,
        on_refused: Callable[[SmsRefused], None] | None = None,
    ) -> None:
        self.link = link
        self.gateway = gateway
        self._on_event = on_event
        self._on_refused = on_refused
        self._timer: asyncio.TimerHandle | None = None
        self._sends: set[asyncio.Task[None]] = set()
        self.send_errors = 0

    async def start(self) -> None:
        await self.gateway.start(self._received)

    def send_frame(self, to: str, frame: bytes, *, ttl: float | None = None) -> int:
        now = asyncio.get_running_loop().time()
        buffer_id = self.link.send_frame(to, frame, now, ttl=ttl)
        self.poke()
        return buffer_id

    def _received(self, sms: Sms) -> None:
        self.link.receive_sms(sms, asyncio.get_running_loop().time())
        self.poke()

    def _fire(self) -> None:
        self._timer = None
        self.link.handle_timer(asyncio.get_running_loop().time())
        self.poke()

    def poke(self) -> None:
        """Send pending SMS, dispatch events, re-arm the timer."""
        loop = asyncio.get_running_loop()
        for sms in self.link.sms_to_send():
            task = loop.create_task(self._send(sms))
            self._sends.add(task)
            task.add_done_callback(self._sends.discard)
        while (refused := self.link.next_refusal()) is not None:
            log.warning(
                "SMS %s from %s at %s refused (%s): dropped",
                refused.what,
                refused.sender,
                self.link.address,
                refused.reason.value,
            )
            if self._on_refused is not None:
                self._on_refused(refused)
        while (event := self.link.next_event()) is not None:
            self._on_event(event)
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        when = self.link.get_timer()
        if when is not None:
            self._timer = loop.call_at(when, self._fire)

    async def _send(self, sms: Sms) -> None:
        try:
            await self.gateway.send(sms)
        except GatewayError:
            # The buffer's retransmission timer covers a refused submit.
            self.send_errors += 1

    async def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
        if self._sends:
            await asyncio.gather(*self._sends, return_exceptions=True)
        await self.gateway.close()


def network_gateway(config: AgentSmsConfig | BrokerSmsConfig) -> SmsGateway | None:
    """The gateway to a real SMS network that ``[sms] gateway`` names (Kannel's smsbox or
    SMPP), for the broker and the device alike; None for ``"simulated"``, a network of the
    tests' own, which each caller refuses with its own message."""
    if config.gateway == "kannel":
        from mdeci.sms.kannel import KannelConfig, KannelGateway

        return KannelGateway(
            KannelConfig(
                sendsms_url=config.kannel_sendsms_url,
                username=config.kannel_username,
                password=config.kannel_password,
                callback_host=config.kannel_callback.host,
                callback_port=config.kannel_callback.port,
            )
        )
    if config.gateway == "smpp":
        from mdeci.sms.smpp import SmppConfig, SmppGateway

        return SmppGateway(
            SmppConfig(
                host=config.smpp_address.host,
                port=config.smpp_address.port,
                system_id=config.smpp_system_id,
                password=config.smpp_password,
            )
        )
    return None
