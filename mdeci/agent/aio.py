"""The asyncio glue of the agent: sockets, tasks and a clock around :class:`AgentCore`.

:class:`Agent` opens the state files, a SIP backend
(:class:`~mdeci.agent.backend.SipBackend`) and a :class:`rudp.aio.RudpEndpoint` with the
broker's :class:`~mdeci.agent.media.MediaLink` (RUDP) beside a
:class:`~mdeci.agent.quic_media.QuicMediaLink` (QUIC; the one the SDP answer accepted is
attached, the other detached), and runs the *SIP worker* (SIP commands
and rebinds, one at a time) and the IP monitor. Which input reaches the core, what its
commands become and when a move is over is :class:`~mdeci.agent.driver.AgentDriver`'s;
what its events do, :class:`~mdeci.agent.reports.Reports`'. The glue keeps no history:
waiting for "something happened" is :meth:`Agent.wait_until` on a condition.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random as _random
import secrets
import time
from collections.abc import Callable
from typing import IO, Any

from mdeci import oplog
from mdeci.agent.applications import Applications
from mdeci.agent.backend import SipBackend, make_backend
from mdeci.agent.core import AgentCore
from mdeci.agent.driver import BYE_TIMEOUT, AgentDriver
from mdeci.agent.errors import AgentError, StateError
from mdeci.agent.events import AttachMedia, Invite, Rebind, SipCommand
from mdeci.agent.ipmonitor import (
    AddressSource,
    Wakeable,
    interface_of,
    make_monitor,
    route_destination,
)
from mdeci.agent.machine import State, Status
from mdeci.agent.media import DataLink, MediaLink
from mdeci.agent.quic_media import QuicMediaLink
from mdeci.agent.reports import Reports
from mdeci.agent.sms import SmsInbox, windowed_gate
from mdeci.agent.state import Fsync, StateFiles, lock_state_dir, make_state_dir, open_state_files
from mdeci.agent.status import AgentStatus, PubResult
from mdeci.churnlog import ChurnLog, Role
from mdeci.config import AgentConfig
from mdeci.frames import Frame
from mdeci.sms.gateway import SmsGateway
from mdeci.tasks import spawn
from rudp.aio import RudpEndpoint

log = logging.getLogger("mdeci.agent")


class Agent(AgentDriver, Applications):
    """The device agent. Build, :meth:`start`, use, :meth:`close`; the applications' calls
    are :class:`~mdeci.agent.applications.Applications`'."""

    def __init__(
        self,
        config: AgentConfig,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        random_bytes: Callable[[int], bytes] = secrets.token_bytes,
        jitter: Callable[[], float] = _random.random,
        address_source: AddressSource | None = None,
        response_timeout: float | None = None,
        sms_gateway: SmsGateway | None = None,
        fsync: Fsync = os.fsync,
    ) -> None:
        self.config = config
        # The wall clock (the churn log's stamps, the broker's absolute times) and the
        # clock of every timer and deadline, which a wall-clock jump must not move.
        self.clock = clock
        self.monotonic = monotonic
        # Every fsync of the state files (tests and benchmarks count them).
        self.fsync = fsync
        self.random_bytes = random_bytes
        self.jitter = jitter
        self.address_source = address_source
        self.response_timeout = response_timeout
        # With [sms] enabled: the phone's SMS gateway (required then; see agent/sms.py).
        self.sms_gateway = sms_gateway
        self.sms: SmsInbox | None = None
        self.core: AgentCore | None = None
        self.backend: SipBackend | None = None
        self.endpoint: RudpEndpoint | None = None
        self.churn: ChurnLog | None = None
        # What the core's events did: churn log lines, counts, listeners, requests.
        self.reports: Reports[asyncio.Future[Frame], asyncio.Queue[dict[str, Any]]]
        self.reports = Reports(config.aor, self._churn_failed)
        self.event_counts = self.reports.counts
        self.recent_events = self.reports.recent
        self._files: StateFiles | None = None
        self._changed = asyncio.Event()
        self._connected = asyncio.Event()
        self._waiters = self.reports.requests
        self._listeners = self.reports.listeners
        self._tasks: set[asyncio.Task[None]] = set()
        self._sip_queue: asyncio.Queue[SipCommand | Rebind] = asyncio.Queue()
        self.media: MediaLink | None = None
        self.quic_media: QuicMediaLink | None = None
        self._link: DataLink | None = None  # the data channel of the session's answer
        self._sync_soon = False  # publishes wait for the outbox's fsync (_sync_outbox)
        self._timer: asyncio.TimerHandle | None = None
        self._monitor: Wakeable | None = None
        self._rebind_error: OSError | None = None
        self._closed = False
        self._lock: IO[bytes] | None = None

    # ------------------------------------------------------------------ life

    async def start(self) -> None:
        """Open the state files, bind SIP and RUDP, start connecting.

        Raises :class:`StateError`, :class:`AgentError`, :class:`OSError` (binding).
        """
        cfg = self.config
        make_state_dir(cfg.state_dir)  # 0700: the user's notifications and publishes
        self._lock = lock_state_dir(cfg.state_dir)  # before any file is opened or rewritten
        files = open_state_files(cfg.state_dir, self.fsync)
        if cfg.sms.enabled or cfg.network.kinds:  # out-of-order nseqs: SMS, network holds
            nseq = files.nseq
            nseq.gate = windowed_gate(nseq.path, nseq.highest, cfg.sms.window)
        self._files = files
        self.churn = ChurnLog(
            cfg.churnlog.path,
            cfg.node,
            self.clock,
            cfg.churnlog.max_bytes,
            cfg.churnlog.backups,
            role=Role.AGENT,
            private=True,
        )
        self.reports.churn = self.churn
        self.backend = make_backend(cfg, self.random_bytes)
        sip_addr = await self.backend.start(self._on_bye)
        self.endpoint = await RudpEndpoint.open(cfg.media.host, cfg.media.port, config=cfg.rudp)
        self.media = MediaLink(
            self.endpoint, self._burst_in, self._on_peer_lost, self._on_broker_restarted
        )
        self.quic_media = QuicMediaLink(
            cfg.media.host, self._on_burst, self._on_peer_lost, cfg.media.quic
        )
        kwargs: dict[str, Any] = {}
        if self.response_timeout is not None:
            kwargs["response_timeout"] = self.response_timeout
        self.core = AgentCore(
            cfg,
            files,
            self._on_event,
            random_bytes=self.random_bytes,
            jitter=self.jitter,
            sip_addr=sip_addr,
            media_addr=self.endpoint.local_addr,
            **kwargs,
        )
        self.core.interface_of = interface_of  # [network] interfaces
        self._spawn(self._sip_worker())
        self._monitor = make_monitor(
            cfg.ip_monitor,
            cfg.sip.host,
            self.address_source,
            dest=await route_destination(cfg.broker.address.host, cfg.sip.host),
        )
        if self._monitor is not None:
            self._spawn(self._monitor.run(self._on_ip_change))
        if cfg.sms.enabled:
            self.sms = SmsInbox.for_agent(cfg, self.sms_gateway, self._on_sms_frame)
            self.sms_gateway = self.sms.runner.gateway
            await self.sms.start()
        self.core.start(self.monotonic())
        self._pump()

    async def close(self, *, clean: bool = True) -> None:
        """Stop. ``clean``: BYE the session and unREGISTER first (best effort)."""
        if self._closed:
            return
        self._closed = True
        if self.media is not None:
            self.media.closed = True
        if self.quic_media is not None:
            self.quic_media.closed = True
        core = self.core
        if core is not None:
            core.close(self.monotonic(), clean=clean)
            self._pump()
            if clean:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        self.wait_until(lambda: core.state is State.CLOSED), 2 * BYE_TIMEOUT
                    )
        if self._monitor is not None:
            self._monitor.close()
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if self.media is not None:
            self.media.stop_reader()
        if self.quic_media is not None:
            self.quic_media.close()
        if self._timer is not None:
            self._timer.cancel()
        self.reports.close()
        if self.backend is not None:
            await self.backend.close()
        if self.sms is not None:
            await self.sms.close()
        if self.endpoint is not None:
            await self.endpoint.close()
        if self._files is not None:
            # The gate's checkpoint (with window 0 the inbox alone holds it meanwhile).
            try:
                self._files.nseq.save()
            except StateError as exc:
                log.warning("state: %s", exc)
            self._files.close()
        if self.churn is not None:
            self.churn.close()
        if self._lock is not None:
            self._lock.close()  # releases the flock

    def _spawn(self, coro: Any) -> asyncio.Task[None]:
        task: asyncio.Task[None] = spawn(coro, log, "agent task")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    # ------------------------------------------------------------------ the driver's hooks

    def _send_frame(self, data: bytes) -> None:
        if self._link is not None:
            self._link.send(data)

    def _attach(self, command: AttachMedia) -> None:
        assert self.media is not None and self.quic_media is not None
        link: DataLink = self.quic_media if command.transport == "quic" else self.media
        if self._link is not None and self._link is not link:
            self._link.detach()  # the session went to the other transport
        self._link = link
        link.attach(command)

    def _run_sip(self, command: SipCommand | Rebind) -> None:
        self._sip_queue.put_nowait(command)

    def _arm(self, when: float | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if when is not None:
            # The core's times are self.monotonic()'s; the loop's timer runs on its own.
            delay = max(0.0, when - self.monotonic())
            self._timer = asyncio.get_running_loop().call_later(delay, self._on_timer)

    def _changed_now(self, connected: bool | None) -> None:
        if connected is not None:
            (self._connected.set if connected else self._connected.clear)()
        self._changed.set()

    async def _sip_worker(self) -> None:
        backend = self.backend
        assert backend is not None
        while True:
            command = await self._sip_queue.get()
            if isinstance(command, Rebind):
                await self._rebind(command.host)
                continue
            outcome = self._sip_outcome(command)
            if outcome is None:
                outcome = await backend.execute(command, timeout=self._sip_timeout())
            self._sip_done(command, outcome)

    async def _rebind(self, host: str) -> None:
        endpoint = self.endpoint
        assert endpoint is not None and self.core is not None and self.media is not None
        self._rebind_error = None
        try:
            await self.media.rebind(host)  # the RUDP socket is our media address in SDP
            if self._link is self.quic_media and self.quic_media is not None:
                await self.quic_media.rebind(host)
        except OSError as exc:
            self._rebind_error = exc
            return
        if self._monitor is not None:
            self._monitor.set_host(host)
        self.core.media_bound(self.monotonic(), endpoint.local_addr)

    # ------------------------------------------------------------------ mobility

    async def _on_ip_change(self, host: str) -> None:
        core = self.core
        assert core is not None
        # The moment of detection (the move's ip_changed comes after the new REGISTER).
        oplog.event("move_detected", logger="agent", addr=host, prev_addr=core.sip_addr[0])
        try:
            await self.move_to(host)
        except (OSError, AgentError):
            # Not moved (the address cannot be bound yet: an IPv6 address still in
            # duplicate address detection): the monitor names it again at its next event
            # or dump instead of taking it for ours.
            if self._monitor is not None:
                self._monitor.set_host(core.sip_addr[0])

    def _burst_in(self, burst: list[bytes]) -> None:
        """A burst from the broker; RUDP's RTT then is the current network's, for the
        best figures the agent reports (mdeci/agent/device.py)."""
        rtt = self.media.srtt_ms if self.media is not None else None
        if rtt is not None and self.core is not None:
            self.core.device.observe_latency(rtt)
        self._on_burst(burst)

    async def move_to(self, host: str) -> None:
        """Move SIP and RUDP to ``host``: rebind RUDP, REGISTER the new contact, re-INVITE.

        Returns once the move is done (or failed: then the agent reconnects with back-off).
        Raises :class:`OSError` when ``host`` cannot be bound.
        """
        before = self._move(host)
        if before is not None:
            await self.wait_until(lambda: self._moved(before))
            if self._rebind_error is not None:
                raise self._rebind_error


__all__ = ["Agent", "AgentStatus", "Invite", "PubResult", "Status"]
