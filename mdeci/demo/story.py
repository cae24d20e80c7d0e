"""Run the demo story in one process: a broker, alice's phone (A) and bob's feed (B).

Timeline (:class:`~mdeci.demo.plan.DemoPlan`, seconds after bob's first publish):

1. the broker starts on a fresh SQLite file; alice (127.0.0.2) and bob (127.0.0.1)
   REGISTER and INVITE; alice subscribes ``StockExchange`` with
   ``(Stock == 'PETR4') and (Price < 25)``;
2. bob publishes a deterministic stream of quotes at ``rate`` per second;
3. alice changes address at each ``moves_at`` (``RunningAgent.move_to``: rebind RUDP,
   REGISTER, re-INVITE);
4. at ``outage_at`` alice's radio goes silent: her RUDP socket moves to ``::1``, so the
   broker's packets hit a closed port and hers cannot reach an IPv4 broker; the broker's
   sends time out (small RUDP retry budget), it marks her DISCONNECTED and queues;
5. after ``outage_for`` she comes back on the last host (REGISTER + re-INVITE) and the
   broker drains her queue in nseq order;
6. once every matching event has reached her application (or ``drain_guard`` ran out)
   everything closes cleanly and :func:`mdeci.demo.summary.judge` gives the verdict.

Churn logs (broker and both agents) go to ``<out>/logs``; ``<out>/summary.json`` keeps the
verdict for scripts and tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdeci.agent.daemon import RunningAgent, run_agent
from mdeci.broker.app import RunningBroker, run_broker
from mdeci.broker.sink import ChurnLogSink, FieldValue
from mdeci.churnlog import ChurnLog, Role
from mdeci.config import (
    AgentConfig,
    AgentMediaConfig,
    AgentRegistrarConfig,
    AuthConfig,
    BrokerConfig,
    BrokerMediaConfig,
    BrokerPeerConfig,
    ChurnLogConfig,
    HostPort,
    IpMonitorConfig,
    IpMonitorMode,
    ReconnectConfig,
    SipConfig,
    StoreConfig,
    UserConfig,
)
from mdeci.demo.plan import FILTER, SUBJECT, DemoPlan, stock_events
from mdeci.demo.summary import Delivered, Outage, Published, Summary, judge
from mdeci.demo.view import Snapshot, View
from mdeci.errors import MdeciError
from mdeci.store.errors import StoreError
from rudp.config import RudpConfig
from rudp.errors import RudpError

DOMAIN = "localhost"
BROKER_HOST = "127.0.0.1"
BOB_HOST = "127.0.0.1"
ALICE = f"sip:alice@{DOMAIN}"
MARKER = ".mdeci-demo"  # marks a folder the demo may wipe
# Loopback SIP timers: a lost datagram is retransmitted after 50 ms, not 500 ms.
T1, T2, T4 = 0.05, 0.4, 0.5
# The broker gives up on a silent peer after ~2-3 s (RTO 0.05 s doubling, 5 retries)
# rather than the default ~2 min: the outage must be detected within the demo.
BROKER_RUDP = RudpConfig(rto_initial=0.2, rto_min=0.05, rto_max=0.8, max_retries=5)
# Alice's own retries outlast the outage: she learns nothing until she comes back, as a
# phone in a tunnel does, and her acks wait to be resent from her new address.
AGENT_RUDP = RudpConfig(rto_initial=0.2, rto_min=0.05, rto_max=0.5, max_retries=120)
SILENT_HOST = "::1"  # alice's RUDP socket during the outage: no route to an IPv4 broker
STARTUP_GUARD = 15.0  # seconds for the sessions to come up; guards against a hang
POLL = 0.25  # seconds between two refreshes of the view


class DemoError(MdeciError):
    """The demo could not run (folder, sockets, a session that never came up)."""


def _loopback() -> frozenset[str]:
    # The agents' IP monitors see one unchanging network: the demo moves alice itself.
    return frozenset({"127.0.0.1/8"})


def prepare_folder(out: Path) -> None:
    """Wipe and recreate ``out`` (only a folder the demo made, or an empty one)."""
    if out.exists():
        if any(out.iterdir()) and not (out / MARKER).exists():
            raise DemoError(f"{out} is not empty and was not made by the demo; not wiping it")
        shutil.rmtree(out)
    (out / "logs").mkdir(parents=True)
    (out / MARKER).write_text("made by mdeci demo; wiped at each run\n")


def broker_config(out: Path) -> BrokerConfig:
    data = out / "broker"
    return BrokerConfig(
        node="broker-1",
        domain=DOMAIN,
        data_dir=data,
        sip=SipConfig(host=BROKER_HOST, port=0, t1=T1, t2=T2, t4=T4),
        media=BrokerMediaConfig(host=BROKER_HOST),
        rudp=BROKER_RUDP,
        store=StoreConfig(url=f"sqlite:///{data / 'broker.db'}"),
        churnlog=ChurnLogConfig(path=out / "logs" / "broker-churn.log"),
        auth=AuthConfig(
            users=(
                UserConfig(user="alice", password="alice-secret"),
                UserConfig(user="bob", password="bob-secret"),
            )
        ),
    )


def agent_config(out: Path, user: str, host: str, broker: RunningBroker) -> AgentConfig:
    state = out / user
    sip_addr = HostPort(*broker.sip_addr)
    return AgentConfig(
        aor=f"sip:{user}@{DOMAIN}",
        password=f"{user}-secret",
        node=f"{user}-phone",
        state_dir=state,
        api_socket=state / "agent.sock",
        registrar=AgentRegistrarConfig(address=sip_addr),
        broker=BrokerPeerConfig(aor=broker.config.aor, address=sip_addr),
        sip=SipConfig(host=host, port=0, t1=T1, t2=T2, t4=T4),
        media=AgentMediaConfig(host=host),
        rudp=AGENT_RUDP,
        reconnect=ReconnectConfig(base=0.2, max=1.0),
        ip_monitor=IpMonitorConfig(mode=IpMonitorMode.POLL, poll_interval=600.0),
        churnlog=ChurnLogConfig(path=out / "logs" / f"{user}-phone.log"),
    )


class _TeeSink:
    """The broker's churn sink: the log file, plus a callback the story watches."""

    def __init__(self, inner: ChurnLogSink, on_event: Callable[[str, str], None]) -> None:
        self.inner = inner
        self.on_event = on_event

    def emit(self, event: str, uri: str, **fields: FieldValue) -> None:
        self.inner.emit(event, uri, **fields)
        self.on_event(event, uri)


@dataclass(slots=True)
class _State:
    """What the story observed; the view and the verdict read it."""

    start: float
    phase: str = "starting"
    published: list[Published] = field(default_factory=list)
    broker_matched: int = 0
    delivered: list[Delivered] = field(default_factory=list)
    last_event: str = ""
    broker_disconnects: list[float] = field(default_factory=list)
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def now(self) -> float:
        return time.monotonic() - self.start

    def on_broker_event(self, event: str, uri: str) -> None:
        if event == "media_disconnected" and uri == ALICE:
            self.broker_disconnects.append(time.monotonic())
            self.changed.set()

    def delivered_ids(self) -> set[str]:
        return {d.msg_id for d in self.delivered}

    def expected_ids(self) -> set[str]:
        return {p.msg_id for p in self.published if p.expected}


async def _until(state: _State, predicate: Callable[[], bool], guard: float) -> bool:
    """Wait until ``predicate()`` holds (re-checked on each change); False after ``guard``."""

    async def wait() -> None:
        while not predicate():
            state.changed.clear()
            await state.changed.wait()

    try:
        await asyncio.wait_for(wait(), guard)
    except TimeoutError:
        return False
    return True


async def _sleep_until(start: float, at: float) -> None:
    # Scheduling the story (bob's pace, alice's moves), not synchronising anything.
    delay = start + at - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)


class Story:
    """One demo run. Build, then ``await play()``; returns the :class:`Summary`."""

    def __init__(self, plan: DemoPlan, out: Path, view: View) -> None:
        self.plan = plan
        self.out = out
        self.view = view
        self.state = _State(start=time.monotonic())
        self.t0 = self.state.start
        self.broker: RunningBroker | None = None
        self.alice: RunningAgent | None = None
        self.bob: RunningAgent | None = None
        self.restore_ms: list[float] = []
        self.outage: Outage | None = None
        self._broker_log: ChurnLog | None = None
        self._consumer: asyncio.Task[None] | None = None

    def note(self, text: str) -> None:
        self.view.note(self.state.now(), text)

    async def play(self) -> Summary:
        prepare_folder(self.out)
        self.state.start = self.t0 = time.monotonic()
        self.view.start()
        refresher = asyncio.create_task(self._refresh())
        try:
            await self._start()
            await self._run()
        finally:
            refresher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await refresher
            self.view.show(self._snapshot())
            self.view.stop()
            await self._close()
        summary = self._summary()
        (self.out / "summary.json").write_text(json.dumps(summary.to_json(), indent=2) + "\n")
        return summary

    # ------------------------------------------------------------------ setup

    async def _start(self) -> None:
        config = broker_config(self.out)
        log = ChurnLog(config.churnlog.path, config.node, time.time, role=Role.BROKER)
        try:
            self.broker = await run_broker(
                config,
                sip_listen=(BROKER_HOST, 0),
                media_listen=(BROKER_HOST, 0),
                log=_TeeSink(ChurnLogSink(log), self.state.on_broker_event),
            )
        except BaseException:
            log.close()
            raise
        self._broker_log = log
        sip_host, sip_port = self.broker.sip_addr
        self.note(f"broker up: SIP {sip_host}:{sip_port}, SQLite {config.store.url}")
        hosts = self.plan.hosts
        self.alice = await run_agent(
            agent_config(self.out, "alice", hosts[0], self.broker), address_source=_loopback
        )
        self.bob = await run_agent(
            agent_config(self.out, "bob", BOB_HOST, self.broker), address_source=_loopback
        )
        try:
            await asyncio.wait_for(self.alice.wait_connected(), STARTUP_GUARD)
            await asyncio.wait_for(self.bob.wait_connected(), STARTUP_GUARD)
        except TimeoutError:
            raise DemoError("the agents' sessions did not come up in time") from None
        self.note(f"alice CONNECTED at {self.alice.status().media_addr}; bob CONNECTED")
        inbox = self.alice.agent.listen()
        self._consumer = asyncio.create_task(self._consume(inbox))
        ok = await asyncio.wait_for(self.alice.agent.subscribe(SUBJECT, FILTER), STARTUP_GUARD)
        self.note(f"alice subscribed {SUBJECT} where {FILTER} ({ok.sub_id})")

    async def _close(self) -> None:
        if self._consumer is not None:
            self._consumer.cancel()
        for agent in (self.alice, self.bob):
            if agent is not None:
                with contextlib.suppress(MdeciError, OSError):
                    await agent.close()
        if self.broker is not None:
            await self.broker.close()
        if self._broker_log is not None:
            self._broker_log.close()

    # ------------------------------------------------------------------ the story

    async def _run(self) -> None:
        state = self.state
        self.t0 = time.monotonic()  # the plan's t = 0: bob's first publish
        state.phase = f"at {self.plan.hosts[0]}"
        publisher = asyncio.create_task(self._publish())
        try:
            await self._journey()
            await publisher
        finally:
            publisher.cancel()
        state.phase = "draining"
        self.note(f"bob done: {len(state.published)} published; waiting for the last ones")
        expected = state.expected_ids()
        done = await _until(state, lambda: expected <= state.delivered_ids(), self.plan.drain_guard)
        if not done:
            self.note(f"gave up waiting after {self.plan.drain_guard:.0f} s")
        state.phase = "done"

    async def _publish(self) -> None:
        assert self.bob is not None
        state = self.state
        for event in stock_events(self.plan.events, self.plan.seed):
            await _sleep_until(self.t0, event.index / self.plan.rate)
            result = await self.bob.agent.publish(SUBJECT, event.attrs, event.payload)
            state.published.append(Published(event.index, result.msg_id, event.matches))
            state.broker_matched += result.matched or 0
            state.changed.set()

    async def _journey(self) -> None:
        plan = self.plan
        for at, host in zip(plan.moves_at, plan.hosts[1:-1], strict=True):
            await _sleep_until(self.t0, at)
            await self._handover(host)
        await _sleep_until(self.t0, plan.outage_at)
        await self._outage()

    async def _handover(self, host: str) -> None:
        assert self.alice is not None
        state = self.state
        state.phase = f"moving to {host}"
        self.note(f"alice moves {self.alice.status().media_addr} -> {host}")
        began = time.monotonic()
        await self.alice.move_to(host)
        seen = len(state.delivered)
        state.phase = f"at {host}"
        restored = await _until(state, lambda: len(state.delivered) > seen, self.plan.drain_guard)
        if restored:
            ms = (state.delivered[seen].at - began) * 1000.0
            self.restore_ms.append(ms)
            self.note(f"first notification at {host} {ms:.0f} ms after the move began")

    async def _outage(self) -> None:
        assert self.alice is not None and self.alice.agent.endpoint is not None
        plan, state = self.plan, self.state
        state.phase = "radio off"
        began = time.monotonic()
        try:
            await self.alice.agent.endpoint.rebind(SILENT_HOST, 0)
        except OSError as exc:
            raise DemoError(
                f"cannot silence alice on {SILENT_HOST} (no IPv6 loopback?): {exc}"
            ) from None
        self.note(f"alice's radio goes silent for {plan.outage_for:.1f} s")
        detected: float | None = None
        if await _until(state, lambda: bool(state.broker_disconnects), plan.outage_for):
            detected = state.broker_disconnects[0] - began
            state.phase = "radio off; broker queues"
            self.note(f"broker: alice DISCONNECTED after {detected:.1f} s; queueing for her")
        await _sleep_until(self.t0, plan.comeback_at)
        host = plan.hosts[-1]
        pending = state.expected_ids() - state.delivered_ids()
        self.note(f"alice comes back at {host}; {len(pending)} notifications wait for her")
        back = time.monotonic()
        await self._handover(host)
        drained = await _until(state, lambda: pending <= state.delivered_ids(), plan.drain_guard)
        drained_in = time.monotonic() - back if drained else None
        if drained_in is not None:
            self.note(f"queue drained: {len(pending)} in {drained_in:.2f} s")
        self.outage = Outage(
            duration=back - began,
            detected_after=detected,
            queued=len(pending),
            drained_in=drained_in,
        )

    async def _consume(self, inbox: asyncio.Queue[dict[str, Any]]) -> None:
        state = self.state
        while True:
            record = await inbox.get()
            state.delivered.append(Delivered(record["msg_id"], record["nseq"], time.monotonic()))
            state.last_event = f"nseq {record['nseq']}: {record.get('text', '')}"
            state.changed.set()

    # ------------------------------------------------------------------ output

    async def _refresh(self) -> None:
        while True:
            self.view.show(self._snapshot())
            await asyncio.sleep(POLL)

    def _snapshot(self) -> Snapshot:
        state = self.state
        broker, alice = self.broker, self.alice
        depth = 0
        sees = "-"
        if broker is not None:
            sees = "CONNECTED" if broker.service.is_connected(ALICE) else "DISCONNECTED"
            with contextlib.suppress(StoreError):
                depth = broker.store.queues.depth(ALICE)
        status, addr = "-", "-"
        if alice is not None:
            with contextlib.suppress(RudpError):  # the endpoint is closing
                st = alice.status()
                status, addr = str(st.status), st.media_addr
            if state.phase.startswith("radio off"):
                addr = f"silent (socket parked on {addr})"
        return Snapshot(
            elapsed=state.now(),
            phase=state.phase,
            broker_sees_alice=sees,
            alice_status=status,
            alice_addr=addr,
            published=len(state.published),
            matched=sum(1 for p in state.published if p.expected),
            delivered=len(state.delivered),
            queue_depth=depth,
            last_event=state.last_event,
        )

    def _summary(self) -> Summary:
        state = self.state
        counts = judge(state.published, state.delivered)
        return Summary(
            published=len(state.published),
            matched=len(state.expected_ids()),
            broker_matched=state.broker_matched,
            delivered=len(state.delivered),
            lost=counts.lost,
            duplicated=counts.duplicated,
            out_of_order=counts.out_of_order,
            unexpected=counts.unexpected,
            restore_ms=tuple(self.restore_ms),
            outage=self.outage,
            logs=self.out / "logs",
            elapsed=state.now(),
        )


async def play(plan: DemoPlan, out: Path, view: View) -> Summary:
    """Run the demo; the verdict is in the returned summary.

    Raises :class:`DemoError` (folder, IPv6 loopback, sessions), or another
    :class:`~mdeci.errors.MdeciError` (database, churn log) when it cannot run.
    """
    return await Story(plan, out, view).play()
