"""A broker and an agent joined by the simulated SMSC (and, when it is up, by "IP").

Time is a number the test moves by hand; nothing sleeps. The broker side chooses a
channel with the real selector; the agent side feeds every frame, from SMS or IP,
through one ``NseqGate`` before the "application".
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import cbor2

from mdeci.channels import (
    Channel,
    ClassPolicy,
    Kind,
    MemoryUsage,
    Outgoing,
    SelectorPolicy,
    SendNow,
    Tariff,
    record_send,
    select,
)
from mdeci.sms.config import SmsConfig
from mdeci.sms.dedupe import NseqGate
from mdeci.sms.link import BufferAcknowledged, BufferExpired, FrameReceived, SmsLink
from mdeci.sms.smsc import SimulatedSmsc, SmscConfig

BROKER, AGENT = "+15550000001", "+15550000002"
POLICY = SelectorPolicy(
    channels=(
        Channel(name="ip", tariff=Tariff(price=0.0), energy_mw=1500, latency_ms=250),
        Channel(
            name="sms", kind=Kind.SMS, tariff=Tariff(price=0.0015), latency_ms=10_000, energy_mw=600
        ),
    ),
    classes={"urgent": ClassPolicy(kinds=frozenset(Kind))},
)


def notify_frame(nseq: int, payload: bytes) -> bytes:
    """A ``notify`` frame as docs/protocol.md §5 has it."""
    return cbor2.dumps(
        {
            "op": "notify",
            "nseq": nseq,
            "sub_id": "s1",
            "subject": "alerts.fire",
            "attrs": {"level": 3},
            "payload": payload,
            "published_at": 1700000000.0 + nseq,
            "msg_id": f"m{nseq}",
        }
    )


@dataclass
class World:
    smsc_config: SmscConfig
    sms_config: SmsConfig
    seed: int = 1
    window: int = 1024
    ttl: float = 120.0
    now: float = 0.0
    ip_up: bool = False
    app: Counter[int] = field(default_factory=Counter)
    refused: int = 0
    by_ip: set[int] = field(default_factory=set)
    acked: set[int] = field(default_factory=set)
    undeliverable: set[int] = field(default_factory=set)
    sms_cost: float = 0.0

    def __post_init__(self) -> None:
        self.smsc = SimulatedSmsc(self.smsc_config, random.Random(self.seed))
        self.broker = SmsLink(BROKER, self.sms_config)
        self.agent = SmsLink(AGENT, self.sms_config)
        self.gate = NseqGate(window=self.window)
        self.usage = MemoryUsage()
        self.queue: dict[int, bytes] = {}  # the broker's queue: nseq -> frame
        self.buffers: dict[int, int] = {}  # buffer id -> nseq

    # -- agent ------------------------------------------------------------------------

    def agent_frame(self, frame: bytes) -> None:
        nseq = cbor2.loads(frame)["nseq"]
        if self.gate.accept(nseq):
            self.app[nseq] += 1
        else:
            self.refused += 1

    # -- broker -----------------------------------------------------------------------

    def publish(self, nseq: int, payload: bytes) -> None:
        frame = notify_frame(nseq, payload)
        self.queue[nseq] = frame
        msg = Outgoing(user="sip:a@x", qclass="urgent", size=len(frame), first_seen=self.now)
        available = {"ip", "sms"} if self.ip_up else {"sms"}
        decision = select(POLICY, msg, available=available, usage=self.usage, now=self.now)
        assert isinstance(decision, SendNow)
        record_send(self.usage, msg, decision, at=self.now)
        if decision.channel.name == "ip":
            self._deliver_ip(nseq)
        else:
            self.buffers[self.broker.send_frame(AGENT, frame, self.now, ttl=self.ttl)] = nseq
        self._pump()

    def _deliver_ip(self, nseq: int) -> None:
        self.by_ip.add(nseq)
        self.agent_frame(self.queue.pop(nseq))

    def ip_returns(self) -> None:
        """re-INVITE done: CONNECTED; flush the queue in order, stop paying for SMS."""
        self.ip_up = True
        for buffer_id in list(self.buffers):
            self.broker.cancel(buffer_id)
            del self.buffers[buffer_id]
        for nseq in sorted(self.queue):
            self._deliver_ip(nseq)

    # -- the clock --------------------------------------------------------------------

    def _pump(self) -> None:
        for link in (self.broker, self.agent):
            for sms in link.sms_to_send():
                if link is self.broker:
                    self.sms_cost += 0.0015
                self.smsc.submit(sms, self.now)
        while (ev := self.agent.next_event()) is not None:
            assert isinstance(ev, FrameReceived) and ev.sender == BROKER
            self.agent_frame(ev.frame)
        while (ev := self.broker.next_event()) is not None:
            if isinstance(ev, BufferAcknowledged):
                nseq = self.buffers.pop(ev.buffer_id)
                self.acked.add(nseq)
                self.queue.pop(nseq, None)  # delivered: the broker may drop it
            elif isinstance(ev, BufferExpired):
                nseq = self.buffers.pop(ev.buffer_id)
                self.undeliverable.add(nseq)
                self.queue.pop(nseq, None)  # TTL over: reported undeliverable

    def run_until(self, until: float) -> None:
        while True:
            times = [
                t
                for t in (
                    self.smsc.next_delivery(),
                    self.broker.get_timer(),
                    self.agent.get_timer(),
                )
                if t is not None
            ]
            nxt = min(times, default=None)
            if nxt is None or nxt > until:
                break
            self.now = max(self.now, nxt)
            for sms in self.smsc.deliver_due(self.now):
                (self.agent if sms.recipient == AGENT else self.broker).receive_sms(sms, self.now)
            for link in (self.broker, self.agent):
                timer = link.get_timer()
                if timer is not None and timer <= self.now:
                    link.handle_timer(self.now)
            self._pump()
        self.now = max(self.now, until)
