"""Benchmark of a reconnect storm: 10,000 connected sessions, the broker killed (SIGKILL)
and restarted; every session CONNECTED again at most 30 s after the restart, with none
lost and none duplicated of a stream published meanwhile.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_storm_bench.py``. It prints the time
from the new broker process's start until the last session is CONNECTED, whether the
30 s goal is met, and the lost and duplicated totals of the stream.

- The broker is a child process (:class:`BrokerProc`, SQLite). It is killed by its own
  PID with SIGKILL and a new one starts at once, as a supervisor restarts it, on the
  same SIP and media ports with the same configuration, data directory and SQLite file:
  it reads back every session stored CONNECTED and PINGs each one under its stored key.
- The agents are :class:`tests.bench.swarm.Swarm` sessions (real digest REGISTER, INVITE
  with an X25519 offer, RUDP secret derived from the answer, ``sub`` over a peer of one
  shared endpoint), whose peers run the agent's RUDP settings (``AGENT_RUDP``: a PING
  after 5 s idle, the broker given up 4 s after an unanswered datagram). What each does
  after the kill is what the agent core does (docs/agent.md "Noticing a dead broker"),
  reduced to its protocol: when RUDP gives the broker up, a re-INVITE in the dialog
  with a new key offer, at once, then a ``list`` probe on the new key's association;
  when, given up, it hears a new incarnation of the broker under the old key
  (``on_restarted``), a fresh association under that key probed with a ``list`` (the
  re-INVITE still completes and re-keys). A failed re-INVITE loses the session; a 481
  or no answer ends the dialog, and the next attempt is a new INVITE (at once after a
  481); other failures wait the agent's back-off (1 s, doubling).
- CONNECTED: the agent's own definition, its probe answered (the ``subs`` reply to its
  ``list``) after the restart, seen by each session itself, not inferred from the
  broker. A session counts once it is CONNECTED with no SIP attempt under way (a
  failing one would lose it again); its time is when it last became CONNECTED. The
  stream's delivery checks it end to end.
- At most 32 re-INVITEs are in flight from the swarm: all its agents share one source
  address, and the broker answers 503 past 64 open requests from one host, which
  devices of their own addresses would not meet. The limit is part of the figure. For
  the same reason the login throttle's failure count is raised past reach (a lock of
  the one source address would refuse every agent); failed logins are still printed.
- The stream: a publisher of its own (another swarm, same behaviour) publishes 20
  numbered messages to a subject ``BENCH_STORM_SAMPLE`` sessions subscribe to (default
  1,000, or all when fewer): 5 acknowledged before the kill, 5 sent while the broker is
  dead, 10 once the publisher is CONNECTED again. A publish without ``pub-ok`` is sent
  again, same ``msg_id``, on each reconnection (the agent's outbox; MQTT's resend of
  unacknowledged QoS 1 publishes); the broker drops a repeated ``msg_id``. Each
  subscriber drops a repeated ``nseq`` (the agent's gate) and acks bursts cumulatively;
  a message counts as duplicated when it reaches the application twice (two ``nseq``).
  The sample keeps 20 x 10,000 notifications from dominating the set-up's time; every
  session's reconnection is measured whatever the sample.
- ``BENCH_SESSIONS`` changes the count (default 10,000). Every wait is bounded by its
  limit, every loop by its count; only our own broker child is killed, by its PID.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections import Counter
from collections.abc import Awaitable
from pathlib import Path

import pytest

from mdeci.config.agent import AGENT_RUDP
from mdeci.frames import Ack, List, Notify, Pub, PubOk, Subs, decode, encode
from rudp.aio import RudpPeer
from rudp.errors import PeerUnreachable
from tests.bench.swarm import Session, Swarm, SwarmError, set_up
from tests.bench.test_broker_bench import BROKER, DOMAIN, HOST, BrokerProc, password

pytestmark = [pytest.mark.bench, pytest.mark.timeout(4000)]

Address = tuple[str, int]
SESSIONS = int(os.environ.get("BENCH_SESSIONS", "10000"))
SAMPLE = min(SESSIONS, int(os.environ.get("BENCH_STORM_SAMPLE", "1000")))
SUBJECT = "storm.stream"
STREAM = 20  # messages: BEFORE before the kill, DURING while dead, the rest after
BEFORE, DURING = 5, 5
CONCURRENCY = 32  # SIP requests in flight from the swarm (module docstring)
SETUP_LIMIT = 2400.0  # seconds for the set-up: a guard, never a synchronisation
RUN_LIMIT = 900.0  # seconds from the restart until every session is CONNECTED
STREAM_LIMIT = 300.0  # seconds for the stream's last deliveries once all are back
GOAL_S = 30.0
PROGRESS = 10.0  # seconds between the storm's progress lines
SIP_ATTEMPTS = 8  # re-INVITEs of one agent before it gives up (back-off between)
BACKOFF = 1.0  # the agent's reconnect.base: seconds before the second attempt, doubling
# The login throttle locks a source address after 5 failed logins: every agent of the
# swarm shares one (module docstring), so any 5 would lock them all.
SETTINGS = ["[auth]", "key_confirm_timeout = 120.0", "[auth.throttle]", "max_failures = 1000000"]


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


class Tally:
    """How many devices are settled (CONNECTED, no SIP attempt under way) at once, and
    an event for all of them at the same time: a device may lose its session again."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.count = 0
        self.all = asyncio.Event()

    def moved(self, settled: bool) -> None:
        self.count += 1 if settled else -1
        if self.count == self.total:
            self.all.set()
        else:
            self.all.clear()


class Device:
    """One agent's session and its answer to a lost or restarted broker (module
    docstring); notifications pass the ``nseq`` gate and are counted by ``msg_id``."""

    def __init__(
        self, swarm: Swarm, session: Session, broker: Address, room: asyncio.Semaphore
    ) -> None:
        self.swarm = swarm
        self.session = session
        self.broker = broker
        self.room = room
        self.connected = True
        self.since: float | None = None  # when the storm began: only then is a probe new
        self.connected_at: float | None = None  # the last time CONNECTED since
        self.noticed_at: float | None = None  # when RUDP first gave the broker up since
        self.via = ""  # what made us CONNECTED again: "restart" or "reinvite"
        self.losses = self.restarts = self.reinvites = 0
        self.sip_failures: Counter[str] = Counter()
        self.gave_up = False
        # CONNECTED, and no SIP attempt under way that may still lose the session.
        self.settled = asyncio.Event()
        self.tally: Tally | None = None
        self.seen: set[int] = set()  # nseq accepted (the agent's gate)
        self.redelivered = 0  # a notification again under an nseq already accepted
        self.messages: Counter[str] = Counter()  # msg_id -> times handed over
        self.want = 0  # distinct messages that complete the stream
        self.complete = asyncio.Event()
        self._req = 1
        self._probe_req = 0
        self._probe_via = ""
        self._sip: asyncio.Task[None] | None = None
        self._ack: tuple[RudpPeer, int] | None = None  # a burst's cumulative ack to send
        self.attach(session.peer)
        if not session.peer.connected:  # given up during the set-up, before we listened
            self._lost(session.peer, PeerUnreachable("the broker stopped answering"))

    def attach(self, peer: RudpPeer) -> None:
        self.session.peer = peer
        peer.on_message = lambda data: self._message(peer, data)
        peer.on_disconnected = lambda error: self._lost(peer, error)
        peer.on_restarted = lambda: self._restarted(peer)

    def storm(self, now: float, tally: Tally) -> None:
        self.since, self.tally = now, tally

    def _send(self, peer: RudpPeer, frame: Pub | List | Ack) -> None:
        try:
            future = peer.send_nowait(encode(frame))
        except PeerUnreachable:
            return  # a dead association: on_disconnected has its consequence
        # A failed send is answered by on_disconnected (a lost association), not here.
        future.add_done_callback(lambda f: f.cancelled() or f.exception())

    def _probe(self, via: str) -> None:
        self._req += 1
        self._probe_req, self._probe_via = self._req, via
        self._send(self.session.peer, List(req=self._req))

    def _now_connected(self, via: str) -> None:
        self.connected = True
        if self.since is not None:
            self.connected_at = asyncio.get_running_loop().time()
            self.via = via
        self._update()
        self.resumed()

    def _update(self) -> None:
        settled = self.connected and self._sip is None and self.connected_at is not None
        if settled != self.settled.is_set():
            if self.tally is not None:
                self.tally.moved(settled)
            if settled:
                self.settled.set()
            else:
                self.settled.clear()

    def resumed(self) -> None:
        """CONNECTED again: what waits for it goes out (the publisher's outbox)."""

    # ------------------------------------------------------------ what RUDP reports

    def _lost(self, peer: RudpPeer, error: PeerUnreachable) -> None:
        if peer is not self.session.peer:
            return
        self.losses += 1
        self.connected = False
        if self.since is not None and self.noticed_at is None:
            self.noticed_at = asyncio.get_running_loop().time()
        if self._sip is None:  # the agent's _attempt: a re-INVITE with new keys, at once
            self._sip = asyncio.get_running_loop().create_task(self._reinvite())
        self._update()

    def _restarted(self, peer: RudpPeer) -> None:
        if peer is not self.session.peer or self.connected:
            return
        # The agent's broker_restarted: a fresh association under the same key, probed.
        self.restarts += 1
        self.swarm.rudp.remove_peer(self.session.key)
        self.attach(self.swarm.rudp.peer(self.session.key, self.session.media))
        self._probe("restart")

    async def _reinvite(self) -> None:
        delay, in_dialog = BACKOFF, True
        try:
            for _ in range(SIP_ATTEMPTS):
                old = self.session.key
                try:
                    async with self.room:
                        await self.swarm.reinvite(self.session, password(self.session.user),
                                                  self.broker, in_dialog=in_dialog)  # fmt: skip
                except SwarmError as exc:
                    # The agent's _answered: a failed INVITE loses the session; 408 and
                    # 481 end the dialog, and after a 481 a new INVITE goes at once.
                    self.sip_failures[f"{'re-' if in_dialog else ''}INVITE {exc.status}"] += 1
                    self.connected = False
                    self._update()
                    if in_dialog and exc.status == 408:
                        self.session.cseq += 2  # an unanswered transaction's CSeq stays used
                    if in_dialog and exc.status in (408, 481):
                        in_dialog = False
                        if exc.status == 481:
                            continue
                    await asyncio.sleep(delay)  # the agent's back-off timer
                    delay *= 2
                    continue
                self.reinvites += 1
                self.swarm.rudp.remove_peer(old)
                self.attach(self.swarm.rudp.peer(self.session.key, self.session.media))
                if self.connected:
                    # A re-INVITE on a live session: new keys, the media path is up.
                    self.resumed()
                else:
                    self._probe("reinvite" if in_dialog else "invite")
                return
            self.gave_up = True
        finally:
            self._sip = None
            self._update()

    def _message(self, peer: RudpPeer, data: bytes) -> None:
        if peer is not self.session.peer:
            return
        frame = decode(data)
        if isinstance(frame, Notify):
            if frame.nseq in self.seen:
                self.redelivered += 1
            else:
                self.seen.add(frame.nseq)
                self.messages[frame.msg_id] += 1
                if len(self.messages) >= self.want > 0:
                    self.complete.set()
            if self._ack is None:
                # One cumulative ack per burst (what one loop turn read), as the agent.
                asyncio.get_running_loop().call_soon(self._send_ack)
            self._ack = (peer, max(frame.nseq, 0 if self._ack is None else self._ack[1]))
        elif isinstance(frame, Subs) and frame.req == self._probe_req:
            self._probe_req = 0
            self._now_connected(self._probe_via)
        else:
            self.frame(frame)

    def _send_ack(self) -> None:
        if self._ack is not None:
            peer, upto = self._ack
            self._ack = None
            if peer is self.session.peer:
                self._send(peer, Ack(upto=upto))

    def frame(self, frame: object) -> None:
        """Another frame from the broker (the publisher's pub-ok)."""


class Publisher(Device):
    """A device that publishes: a publish without ``pub-ok`` goes again, same
    ``msg_id``, on every reconnection (the agent's outbox)."""

    def __init__(
        self, swarm: Swarm, session: Session, broker: Address, room: asyncio.Semaphore
    ) -> None:
        super().__init__(swarm, session, broker, room)
        self.unacked: dict[str, Pub] = {}
        self.resent = 0
        self.all_ok = asyncio.Event()

    def publish(self, numbers: range) -> None:
        self.all_ok.clear()
        for i in numbers:
            self._req += 1
            pub = Pub(req=self._req, msg_id=f"m{i:03d}", subject=SUBJECT, payload=b"%d" % i)
            self.unacked[pub.msg_id] = pub
            if self.connected:
                self._send(self.session.peer, pub)

    def resumed(self) -> None:
        for pub in self.unacked.values():
            self.resent += 1
            self._send(self.session.peer, pub)

    def frame(self, frame: object) -> None:
        if isinstance(frame, PubOk):
            self.unacked.pop(frame.msg_id, None)
            if not self.unacked:
                self.all_ok.set()


async def _bounded(waits: list[Awaitable[object]], limit: float) -> float:
    """Wait for every one of ``waits`` or ``limit`` seconds; the seconds it took."""
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    tasks = [asyncio.ensure_future(w) for w in waits]
    if tasks:
        _, pending = await asyncio.wait(tasks, timeout=limit)
        for task in pending:
            task.cancel()
    return loop.time() - t0


def _status(devices: list[Device]) -> str:
    back = sum(d.settled.is_set() for d in devices)
    return f"{back}/{len(devices)} CONNECTED again"


async def _progress(devices: list[Device], t0: float) -> None:
    """A line every PROGRESS seconds until cancelled: where the storm's time goes (a
    sampling interval, not a synchronisation; bounded by RUN_LIMIT)."""
    loop = asyncio.get_running_loop()
    for _ in range(int(RUN_LIMIT / PROGRESS) + 1):
        await asyncio.sleep(PROGRESS)
        failures = sum((d.sip_failures for d in devices), Counter[str]())
        print(
            f"  +{loop.time() - t0:.0f} s: {_status(devices)}, "
            f"{sum(d.noticed_at is not None for d in devices)} noticed the loss, "
            f"{sum(d.reinvites for d in devices)} (re-)INVITEs answered 2xx, failed "
            f"{dict(failures)}; load {_load()}",
            flush=True,
        )


def _at(times: list[float], share: float) -> float:
    """The ``share`` quantile of sorted ``times`` (nan for none)."""
    return times[max(0, int(len(times) * share) - 1)] if times else float("nan")


async def test_reconnect_storm(tmp_path: Path) -> None:
    users = [f"u{i:05d}" for i in range(SESSIONS)]
    everyone = [*users, "pub"]
    url = "sqlite:///broker.db"
    broker = await BrokerProc.start(tmp_path, url, everyone, settings=SETTINGS)
    swarms: list[Swarm] = []
    devices: list[Device] = []
    try:
        swarm = await Swarm.open(HOST, DOMAIN, BROKER, AGENT_RUDP)
        pub_swarm = await Swarm.open(HOST, DOMAIN, BROKER, AGENT_RUDP)
        swarms += [swarm, pub_swarm]
        sampled = set(users[:SAMPLE])

        def subject(user: str) -> str:
            return SUBJECT if user in sampled else f"rss.{user}"

        t_setup = time.perf_counter()
        sessions = await set_up(
            swarm, users, {u: password(u) for u in users}, broker.sip, CONCURRENCY,
            SETUP_LIMIT, subject,
        )  # fmt: skip
        setup_s = time.perf_counter() - t_setup
        (pub_session,) = await set_up(
            pub_swarm, ["pub"], {"pub": password("pub")}, broker.sip, 1, SETUP_LIMIT
        )
        room = asyncio.Semaphore(CONCURRENCY)
        devices = [Device(swarm, s, broker.sip, room) for s in sessions]
        publisher = Publisher(pub_swarm, pub_session, broker.sip, room)
        stream = [d for d in devices if d.session.user in sampled]
        for d in stream:
            d.want = STREAM
        print(
            f"\n{SESSIONS} sessions set up in {setup_s:.1f} s ({SESSIONS / setup_s:.0f}/s), "
            f"{SAMPLE} of them subscribed to the stream; load {_load()}"
        )

        publisher.publish(range(BEFORE))
        await asyncio.wait_for(publisher.all_ok.wait(), STREAM_LIMIT)

        # The storm: SIGKILL our own child, a new broker at once on its ports and files.
        loop = asyncio.get_running_loop()
        tally = Tally(len(devices) + 1)
        for d in [*devices, publisher]:
            d.storm(loop.time(), tally)
        sip_port, media_port = broker.sip[1], broker.media_port
        t_kill = loop.time()
        os.kill(broker.pid, signal.SIGKILL)
        await asyncio.wait_for(broker.proc.wait(), 30)
        publisher.publish(range(BEFORE, BEFORE + DURING))  # to a dead broker
        t_restart = loop.time()
        progress = loop.create_task(_progress(devices, t_restart))
        broker = await BrokerProc.start(
            tmp_path, url, everyone, settings=SETTINGS, ports=(sip_port, media_port),
            ready=RUN_LIMIT,
        )  # fmt: skip
        listening = loop.time() - t_restart
        back_then = _status(devices)
        cpu0 = broker.cpu_s()

        await _bounded([tally.all.wait()], RUN_LIMIT)
        cpu_reconnect = broker.cpu_s()
        progress.cancel()
        times = sorted(
            d.connected_at - t_restart
            for d in devices
            if d.settled.is_set() and d.connected_at is not None
        )
        publisher.publish(range(BEFORE + DURING, STREAM))
        await _bounded([publisher.all_ok.wait()], STREAM_LIMIT)
        await _bounded([d.complete.wait() for d in stream], STREAM_LIMIT)

        lost = sum(STREAM - len(d.messages) for d in stream)
        duplicated = sum(n - 1 for d in stream for n in d.messages.values())
        via = Counter(d.via for d in devices if d.settled.is_set())
        failures = sum((d.sip_failures for d in devices), Counter[str]())
        back = len(times) == SESSIONS
        last = times[-1] if back else float("nan")
        print(
            f"restart: broker listening {listening:.1f} s after its start (broker CPU "
            f"{cpu0:.1f} s: start-up and restore of the sessions, while serving; "
            f"{back_then} by then); "
            f"{_status(devices)}; the last {last:.1f} s after the restart (median "
            f"{_at(times, 0.5):.1f} s, 90% {_at(times, 0.9):.1f} s); broker CPU "
            f"{cpu_reconnect:.1f} s by then; load {_load()}"
        )
        noticed = sorted(d.noticed_at - t_restart for d in devices if d.noticed_at)
        print(
            f"noticed: {len(noticed)} agents gave the dead broker up, median "
            f"{_at(noticed, 0.5):.1f} s, last {_at(noticed, 1.0):.1f} s after the restart "
            f"(the kill was {t_restart - t_kill:.2f} s before it)"
        )
        print(
            f"how: {dict(via)} (restart: a probe on a fresh association under the old key; "
            f"reinvite / invite: a probe after a re-INVITE / a new INVITE); "
            f"{sum(d.reinvites for d in devices)} (re-)INVITEs answered 2xx, failed: "
            f"{dict(failures)}; {sum(d.losses for d in devices)} associations given up, "
            f"{sum(d.restarts for d in devices)} restarted ones heard, {swarm.retransmits} "
            f"SIP retransmissions; {sum(d.gave_up for d in devices)} agents gave up"
        )
        print(
            f"stream: {STREAM} messages x {len(stream)} subscribers: {lost} lost, "
            f"{duplicated} duplicated ({sum(d.redelivered for d in stream)} redeliveries "
            f"dropped by nseq, {publisher.resent} publishes sent again)"
        )
        verdict = "met" if back and last <= GOAL_S else "NOT met"
        print(f"goal: all {SESSIONS} CONNECTED <= {GOAL_S:.0f} s after the restart: {verdict}")
        assert back, _status(devices)
        assert all(d.connected for d in devices), "a session lost again after the storm"
        assert publisher.settled.is_set() and not publisher.unacked
        assert (lost, duplicated) == (0, 0)
        assert all(m == f"m{int(m[1:]):03d}" for d in stream for m in d.messages)
    finally:
        for s in swarms:
            await s.close()
        await broker.stop()
