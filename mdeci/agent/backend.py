"""SIP backends of the agent: one interface, our ``sip/`` stack (default) or pjsua2.

A backend carries out the core's SIP commands (:mod:`mdeci.agent.core`) and reports a
:class:`~mdeci.agent.events.SipOutcome` for each; it tells the glue when the broker ends
the dialog (``on_bye(call_id)``). It never raises for a failed request: every failure is
an outcome (status None when there was no answer at all). ``[sip] stack`` in agent.toml
chooses: ``"mdeci"`` (this module's :class:`MdeciSipBackend`) or ``"pjsua2"``
(:mod:`mdeci.agent.pjsua2_backend`).

The transport is configuration, not logic: REGISTER and INVITE go over the first of
``[sip] transports`` (``"udp"``, ``"tcp"`` or ``"tls"``) to ``[registrar] address`` and
``[broker] address``; in-dialog requests follow the dialog (its route set, else the
broker's Contact). Over TLS the peer's certificate is verified against ``[sip] tls_ca``
(the system's CAs without it) and its name or address; with ``tls_cert``/``tls_key`` the
agent also listens for TLS on ``tls_port``, which a proxy needs to reach it (RFC 3261
§26.2: requests to a ``sips:`` Contact open a new TLS connection).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from collections.abc import Callable, Mapping
from typing import Protocol

from mdeci.agent.errors import AgentError
from mdeci.agent.events import (
    Address,
    Bye,
    Invite,
    MoveSip,
    Register,
    Reinvite,
    SipCommand,
    SipOutcome,
)
from mdeci.config import AgentConfig
from sip.aio.ua import DialogEnded, IncomingRequest, Reply, UaConfig, UserAgent
from sip.dialog import Dialog
from sip.errors import SipError, SipParseError, SipRequestFailed
from sip.message import Response
from sip.transaction import TimerConfig
from sip.uri import NameAddr, SipUri

OnBye = Callable[[str], None]
# Seconds between CRLF keep-alives on our TCP/TLS connection (RFC 5626 §3.5.1 suggests
# 95-120 s for NATs): under the broker's idle timeout (300 s) and Kamailio's default
# connection lifetime (120 s), so the flow the broker sends its BYE over stays open.
STREAM_KEEPALIVE = 90.0


class SipBackend(Protocol):
    """What the agent needs from a SIP stack."""

    name: str
    transport: str  # how it reaches the registrar and the broker: "udp", "tcp" or "tls"

    @property
    def received(self) -> Mapping[str, int]:
        """SIP messages received per transport (what ``mdeci status`` shows)."""

    @property
    def contact(self) -> str:
        """The Contact URI we register now ("" before :meth:`start`)."""

    async def start(self, on_bye: OnBye) -> Address:
        """Bind; our SIP address. Raises :class:`OSError`, :class:`AgentError`."""

    async def execute(self, command: SipCommand, *, timeout: float | None = None) -> SipOutcome:
        """Carry out one command (never raises for a failed request)."""

    async def close(self) -> None:
        """Release sockets and threads (no BYE: the core asks for it first)."""


def make_backend(config: AgentConfig, random_bytes: Callable[[int], bytes]) -> SipBackend:
    """The backend ``config.sip.stack`` names. Raises :class:`AgentError`."""
    if config.sip.stack == "pjsua2":
        from mdeci.agent.pjsua2_backend import Pjsua2Backend

        return Pjsua2Backend(config, random_bytes)
    return MdeciSipBackend(config, random_bytes)


async def _refuse(req: IncomingRequest) -> Reply:
    # The broker never calls us; an INVITE from anyone gets 488, the rest 405.
    return Reply(488 if req.request.method == "INVITE" else 405)


def _bare(uri: str) -> str:
    """A contact URI without its parameters (``;transport=tcp``, ``;expires=``...)."""
    return uri.split(";")[0]


def _path(path: object) -> str | None:
    return None if path is None else str(path)


def _contact_uris(response: Response) -> list[str]:
    out: list[str] = []
    for value in response.headers.get_all("Contact"):
        with contextlib.suppress(SipParseError):
            contact = NameAddr.parse(value)
            if isinstance(contact.uri, SipUri):
                out.append(_bare(str(contact.uri)))
    return out


class MdeciSipBackend:
    """Our ``sip/`` stack (:class:`sip.aio.ua.UserAgent`)."""

    name = "mdeci"

    def __init__(
        self,
        config: AgentConfig,
        random_bytes: Callable[[int], bytes],
        *,
        keepalive: float = STREAM_KEEPALIVE,
    ) -> None:
        """Raises :class:`AgentError` when a TLS file cannot be read."""
        self.config = config
        self.keepalive = keepalive
        sip = config.sip
        self.transport = sip.transports[0]
        ua_config = UaConfig(
            aor=config.aor,
            password=config.password,
            timers=TimerConfig(t1=sip.t1, t2=sip.t2, t4=sip.t4),
            tcp="tcp" in sip.transports,
            tls_cert=_path(sip.tls_cert) if "tls" in sip.transports else None,
            tls_key=_path(sip.tls_key) if "tls" in sip.transports else None,
            tls_ca=_path(sip.tls_ca),
            tls_port=sip.tls_port,
        )
        try:
            self.ua = UserAgent(ua_config, _refuse, random=random_bytes)
        except (OSError, ssl.SSLError) as exc:  # the TLS files are read here
            raise AgentError(f"[sip] tls_ca/tls_cert/tls_key: {exc}") from exc
        self._dialog: Dialog | None = None
        self._own_contacts: set[str] = set()  # every contact we registered (not duplicates)
        self._watcher: asyncio.Task[None] | None = None
        self._pinger: asyncio.Task[None] | None = None
        self._stale: list[str] = []  # contacts left behind by moves, to remove
        self._cleanups: set[asyncio.Task[None]] = set()

    @property
    def received(self) -> Mapping[str, int]:
        return dict(self.ua.stats.received)

    @property
    def contact(self) -> str:
        """Our current Contact URI for :attr:`transport` (``sips:`` over TLS)."""
        return str(NameAddr.parse(self.ua.contact_header(self.transport)).uri)

    @property
    def registrar(self) -> Address:
        return (self.config.registrar.address.host, self.config.registrar.address.port)

    async def start(self, on_bye: OnBye) -> Address:
        addr = await self.ua.start(self.config.sip.host, self.config.sip.port)
        self._watcher = asyncio.create_task(self._watch(on_bye))
        if self.transport != "udp":
            self._pinger = asyncio.create_task(self._ping())
        return addr

    async def _ping(self) -> None:
        while True:
            await asyncio.sleep(self.keepalive)  # a period, not a wait for an event
            self.ua.transports.ping_streams()

    async def _watch(self, on_bye: OnBye) -> None:
        while True:
            event = await self.ua.events.get()
            dialog = self._dialog
            if (
                isinstance(event, DialogEnded)
                and event.reason == "bye received"
                and dialog is not None
                and event.dialog.id == dialog.id
            ):
                self._dialog = None
                on_bye(dialog.call_id)

    async def close(self) -> None:
        for task in list(self._cleanups):
            task.cancel()
        await asyncio.gather(*self._cleanups, return_exceptions=True)
        for running in (self._watcher, self._pinger):
            if running is not None:
                running.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await running
        await self.ua.close()

    async def execute(self, command: SipCommand, *, timeout: float | None = None) -> SipOutcome:
        try:
            if timeout is None:
                return await self._execute(command)
            return await asyncio.wait_for(self._execute(command), timeout)
        except SipRequestFailed as exc:
            return SipOutcome(status=exc.status, reason=exc.reason, local_addr=self.ua.local_addr)
        except TimeoutError:
            return SipOutcome(status=None, reason="no answer", local_addr=self.ua.local_addr)
        except (SipError, OSError, AgentError) as exc:
            return SipOutcome(status=None, reason=str(exc), local_addr=self.ua.local_addr)

    async def _execute(self, command: SipCommand) -> SipOutcome:
        ua = self.ua
        if isinstance(command, Register):
            if command.expires == 0:
                if ua.registered_for == 0:
                    return SipOutcome(status=200, reason="not registered")
                response = await ua.unregister()
                return SipOutcome(status=response.status, reason=response.reason)
            self._own_contacts.add(_bare(self.contact))
            response = await ua.register(self.registrar, command.expires, transport=self.transport)
            others = tuple(c for c in _contact_uris(response) if c not in self._own_contacts)
            return SipOutcome(
                status=response.status,
                reason=response.reason,
                local_addr=ua.local_addr,
                contacts=others,
            )
        if isinstance(command, Invite):
            broker = (self.config.broker.address.host, self.config.broker.address.port)
            dialog, response = await ua.invite(
                self.config.broker.aor, broker, command.offer, transport=self.transport
            )
            self._dialog = dialog
            return SipOutcome(
                status=response.status,
                reason=response.reason,
                body=response.body,
                call_id=dialog.call_id,
                local_addr=ua.local_addr,
            )
        if isinstance(command, Reinvite):
            current = self._dialog
            if current is None or current.id not in ua.dialogs:
                return SipOutcome(status=481, reason="no dialog")
            response = await ua.reinvite(current, command.offer)
            self._remove_stale()
            return SipOutcome(
                status=response.status,
                reason=response.reason,
                body=response.body,
                call_id=current.call_id,
            )
        if isinstance(command, MoveSip):
            return await self._move(command.host)
        if isinstance(command, Bye):
            ending, self._dialog = self._dialog, None
            if ending is None or ending.id not in ua.dialogs:
                return SipOutcome(status=481, reason="no dialog")
            response = await ua.bye(ending)
            return SipOutcome(status=response.status, reason=response.reason)
        raise AgentError(f"unknown SIP command {command!r}")

    async def _move(self, host: str) -> SipOutcome:
        ua = self.ua
        old_contact = self.contact
        was_registered = ua.registered_for > 0
        addr = await ua.move(host, 0)
        self._own_contacts.add(_bare(self.contact))
        if was_registered and old_contact != self.contact:
            # Removed once the session is re-INVITEd (the restore does not wait for it).
            self._stale.append(old_contact)
            if self._dialog is None:
                self._remove_stale()
        return SipOutcome(status=200, reason="moved", local_addr=addr)

    def _remove_stale(self) -> None:
        stale, self._stale = self._stale, []
        for contact in stale:
            task = asyncio.get_running_loop().create_task(self._unbind(contact))
            self._cleanups.add(task)
            task.add_done_callback(self._cleanups.discard)

    async def _unbind(self, contact: str) -> None:
        """Remove a contact we no longer use (RFC 3261 §10.2.2: Expires 0 for that
        contact; a new Call-ID is allowed there); it would stay bound until it expires."""
        ua = self.ua
        request = ua.build_request(
            "REGISTER",
            f"sip:{ua.aor_uri.host}",
            to=f"<{self.config.aor}>",
            extra=[("Expires", "0")],
            transport=self.transport,
        )
        # The contact exactly as registered (a registrar compares the whole URI).
        request.headers.set("Contact", f"<{contact}>")
        with contextlib.suppress(SipError, OSError):
            await ua.request(request, self.registrar, self.transport)
