"""The user agent's server half in asyncio: the requests the transaction layer delivers,
answered as :class:`sip.ua.UasCore` decides, or by the application's handler in a task.

This module owns the handler tasks, the count of requests each source host has with the
handler (which :meth:`UasCore.screen` caps), and the 2xx retransmission timers' callbacks
(§13.3.1.4); :class:`sip.aio.ua.UserAgent` runs the one timer.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections import Counter
from collections.abc import Awaitable, Callable, Coroutine

from sip.aio.transport import Address, Transports
from sip.aio.uac import Requests
from sip.dialog import Dialog, TwoXxRetransmitter
from sip.errors import SipError, SipParseError, TransactionError
from sip.events import DialogConfirmed, DialogRefreshed, DialogStarted, IncomingRequest
from sip.message import Request, Response, serialize
from sip.transaction import RequestReceived, TransactionLayer, transaction_key
from sip.ua import (
    Answer,
    Cancelled,
    Dispatch,
    Reply,
    UasCore,
    amplifies,
    answer_address,
    invite_key,
    is_challenge,
    is_unproven,
)
from sip.uac import UacCore

Handler = Callable[[IncomingRequest], Awaitable[Reply]]


class Server:
    """The serving half of one :class:`~sip.aio.ua.UserAgent`; ``arm`` re-arms the UA's
    timer when a 2xx retransmitter starts."""

    def __init__(
        self,
        core: UasCore,
        uac: UacCore,
        client: Requests,
        layer: TransactionLayer,
        transports: Transports,
        handler: Handler,
        arm: Callable[[], None],
    ) -> None:
        self.core, self.uac, self.client, self.layer = core, uac, client, layer
        self.transports, self.handler, self.events = transports, handler, client.events
        self.pump, self.arm = client.pump, arm
        self.busy: Counter[str] = Counter()  # requests per source host the handler has
        self.tasks: set[asyncio.Task[None]] = set()

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()

    def on_request(self, event: RequestReceived, transport: str) -> None:
        """A request the layer delivers (a new transaction, or an ACK for a 2xx)."""
        msg, source = event.request, event.source
        if msg.method == "ACK":
            if (confirmed := self.core.acked(msg)) is not None:
                self.events.put_nowait(DialogConfirmed(confirmed))
            return
        invite_exists = msg.method == "CANCEL" and invite_key(msg) in self.layer.servers
        try:
            decision = self.core.decide(msg, invite_exists, source)
        except SipParseError as exc:
            self._respond(msg, Reply(400, reason=f"Bad Request ({exc.reason})"[:120]))
            return
        if isinstance(decision, Answer):
            if is_challenge(decision.reply):
                self._challenge(msg, decision.reply, source, transport)
                return
            self._respond(msg, decision.reply, decision.dialog)
            if decision.end is not None and decision.dialog is not None:
                self.client.forget(decision.dialog, decision.end)
        elif isinstance(decision, Cancelled):  # §9.2: 200 to the CANCEL, 487 to the INVITE
            self._respond(msg, Reply(200))
            self._respond(decision.invite, Reply(487), decision.dialog)
            if decision.dialog is not None:
                decision.dialog.answered_invite()
        else:
            self._spawn(self._serve(msg, decision, source, transport))

    def _spawn(self, coro: Coroutine[None, None, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    async def _serve(
        self, msg: Request, dispatch: Dispatch, source: Address, transport: str
    ) -> None:
        self.busy[source[0]] += 1
        try:
            reply = await self.handler(IncomingRequest(msg, source, transport, dispatch.dialog))
        except Exception as exc:
            reply = Reply(500, reason=f"Server Internal Error ({type(exc).__name__})")
        finally:
            self.busy[source[0]] -= 1
            if self.busy[source[0]] <= 0:
                del self.busy[source[0]]
        answer = self.core.after_handler(msg, reply, dispatch)
        if answer is None:
            return  # a CANCEL answered it already
        if is_challenge(answer):
            self._challenge(msg, answer, source, transport)
        elif msg.method != "INVITE" or not 200 <= answer.status < 300:
            self._respond(msg, answer, dispatch.dialog)
        else:
            self._accept(msg, answer, dispatch.dialog, source, transport)

    def _challenge(self, msg: Request, reply: Reply, source: Address, transport: str) -> None:
        # Sent statelessly, once (sip.ua.is_challenge says why).
        response = self.core.build_response(msg, reply, tag=self.uac.new_tag())
        if self._too_large(msg, response):
            return
        with contextlib.suppress(TransactionError):
            self.layer.respond_statelessly(response, answer_address(response, source, transport))
        self.pump(transport)

    def _too_large(self, msg: Request, response: Response) -> bool:
        """An unproven answer larger than ``max_answer_ratio`` allows is not sent, and its
        transaction is dropped (sip.ua.UaConfig): a spoofed source gets no more than it
        sent. True when so."""
        ratio = self.core.config.max_answer_ratio
        if not is_unproven(msg, response.status) or not amplifies(serialize(response), msg, ratio):
            return False
        self.core.stats.too_large += 1
        with contextlib.suppress(SipParseError):
            self.layer.forget_server(transaction_key(msg))
        return True

    def _accept(
        self, msg: Request, reply: Reply, dialog: Dialog | None, source: Address, transport: str
    ) -> None:
        made = dialog or self.core.new_dialog(msg, self.uac.new_tag())
        if isinstance(made, Reply):
            self._respond(msg, made)
            return
        response = self._respond(msg, reply, made)
        record = self.core.dialogs.record(made.id)
        if response is None or record is None:
            return
        dest = self.core.accepted(made, response, source, transport)
        if dest is not None:

            def give_up() -> None:  # §13.3.1.4: no ACK within 64*T1, the UAS ends it
                self.core.dialogs.retransmit(made.id, None)
                self._spawn(self._bye_quietly(made))

            retransmitter = TwoXxRetransmitter(
                wire=serialize(response),
                start=asyncio.get_running_loop().time(),
                config=self.core.config.timers,
                on_resend=lambda wire: self.transports.send_soon(wire, dest, "udp"),
                on_give_up=give_up,
            )
            self.core.dialogs.retransmit(made.id, retransmitter)
            self.arm()
        self.events.put_nowait(DialogRefreshed(made, msg.body) if dialog else DialogStarted(made))

    async def _bye_quietly(self, dialog: Dialog) -> None:
        with contextlib.suppress(SipError, OSError):
            await self.client.bye(dialog)

    def _respond(self, msg: Request, reply: Reply, dialog: Dialog | None = None) -> Response | None:
        tag = dialog.local_tag if dialog is not None else self.uac.new_tag()
        response = self.core.respond(msg, reply, tag=tag, contact=self.uac.contact_header)
        if response is None or self._too_large(msg, response):
            return None
        try:
            self.layer.send_response(response, asyncio.get_running_loop().time())
        except TransactionError:
            return None
        self.pump("udp")
        return response


__all__ = ["Handler", "Server"]
