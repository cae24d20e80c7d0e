"""The in-order option on the broker core, on a migrated store with a fake clock: a
notification of an in-order subscription never overtakes an earlier one held for a
cheaper network; one that must go (urgent, or at its deadline) takes the held ones along,
first. Another subscription of the same user is still reordered."""

from __future__ import annotations

import dataclasses
import itertools

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mdeci.broker import MemorySink
from mdeci.broker.network_holds import NetworkHolds
from mdeci.channels.config import default_class_configs
from mdeci.channels.networks import THESIS_NETWORKS
from mdeci.frames import Ack, Calendar, CalendarOk, CalendarRule, Device, Pub, PubOk, encode
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock, add_session, make_broker
from tests.broker.core_helpers import PUBLISHER, notifies, one, subscribe

BULK_DMAX = 100.0
P_WIFI = 0.5  # the calendar's: a bulk notification waits P x Dmax at most
CLASSES = {c.name: c.policy() for c in default_class_configs()}
CLASSES["bulk"] = dataclasses.replace(CLASSES["bulk"], max_delay=BULK_DMAX)
_users = itertools.count()


class Device_:
    """One user with two subscriptions: ``ordered`` (in order) and ``free``."""

    def __init__(self, store: BrokerStore, clock: FakeClock, sink: MemorySink) -> None:
        n = next(_users)
        self.uri = f"sip:u{n}@localhost"
        self.prefix = f"p{n}"
        self.clock = clock
        broker = self.broker = make_broker(store, clock, sink)
        broker.classes = frozenset(CLASSES)

        def in_order(sub_id: int) -> bool:
            compiled = broker.core.matcher.get(sub_id)
            return compiled is not None and compiled.in_order

        broker.core.holds = NetworkHolds(
            THESIS_NETWORKS, CLASSES, sink, clock, sub_in_order=in_order
        )
        add_session(store, self.uri, clock())
        self.ordered = int(subscribe(broker, self.uri, f"{self.prefix}.o", in_order=True).sub_id)
        self.free = int(subscribe(broker, self.uri, f"{self.prefix}.f").sub_id)
        rules = (CalendarRule(channel="wifi", p=P_WIFI),)
        calendar = encode(Calendar(req=2, rules=rules))
        assert isinstance(one(broker.handle_frame(self.uri, calendar)), CalendarOk)
        assert broker.handle_frame(self.uri, encode(Device(network="cellular"))) == []
        broker.mark_connected(self.uri, ("127.0.0.1", 4000))
        self.published: dict[int, tuple[int, str, float]] = {}  # nseq: sub, class, at
        self.received: list[int] = []
        self._msg = itertools.count()

    def pub(self, ordered: bool, qclass: str) -> None:
        subject = f"{self.prefix}.{'o' if ordered else 'f'}"
        frame = Pub(
            req=7, msg_id=f"{self.prefix}-{next(self._msg)}", subject=subject, qclass=qclass
        )
        assert isinstance(one(self.broker.handle_frame(PUBLISHER, encode(frame))), PubOk)
        nseq = len(self.published) + 1
        self.published[nseq] = (self.ordered if ordered else self.free, qclass, self.clock())

    def take(self) -> list[int]:
        """What the delivery sends now: takes until two in a row send nothing (a take
        that releases held ones sends nothing itself; its glue takes again)."""
        got: list[int] = []
        empty = 0
        while empty < 2:
            batch = [n.nseq for n in notifies(self.broker, self.uri)]
            got += batch
            empty = 0 if batch else empty + 1
        self.received += got
        return got

    def network(self, kind: str) -> None:
        assert self.broker.handle_frame(self.uri, encode(Device(network=kind))) == []

    def ack(self) -> None:
        if self.received:
            self.broker.handle_frame(self.uri, encode(Ack(upto=max(self.received))))
            self.broker.flush_acks()

    def of(self, sub_id: int) -> list[int]:
        return [n for n in self.received if self.published[n][0] == sub_id]


def test_an_urgent_one_takes_the_held_ones_along(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    d = Device_(store, clock, sink)
    d.pub(True, "bulk")
    d.pub(False, "bulk")
    assert d.take() == []  # both held: the calendar expects Wi-Fi
    d.pub(False, "urgent")
    assert d.take() == [3]  # the free subscription's urgent one overtakes its held bulk
    d.pub(True, "urgent")
    assert d.take() == [1, 4]  # the ordered one's takes its held bulk along, first
    reasons = {
        int(str(e.fields["nseq"])): str(e.fields["reason"])
        for e in sink.named("channel_decided")
        if e.uri == d.uri
    }
    assert reasons[1] == "network=cellular class=bulk decision=deliver why=in_order"
    pulled = [e for e in sink.named("channel_decided") if e.fields["nseq"] == 1][-1]
    assert isinstance(pulled.fields["cost"], float) and pulled.fields["cost"] > 0  # cellular
    d.network("wifi")
    assert d.take() == [2]


def test_a_later_bulk_one_waits_behind_a_held_one_and_both_go_on_wifi(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    d = Device_(store, clock, sink)
    d.pub(True, "bulk")
    clock.advance(10.0)
    d.pub(True, "bulk")
    d.pub(True, "normal")  # goes now: it takes both along
    assert d.take() == [1, 2, 3]
    d.pub(True, "bulk")
    assert d.take() == []
    clock.advance(P_WIFI * BULK_DMAX)
    d.broker.release_due()
    assert d.take() == [4]


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("pub"), st.booleans(), st.sampled_from(["bulk", "normal", "urgent"])),
        st.tuples(st.just("tick"), st.floats(0.0, 0.7 * BULK_DMAX), st.just("")),
        st.tuples(st.just("net"), st.booleans(), st.sampled_from(["wifi", "cellular"])),
        st.tuples(st.just("ack"), st.booleans(), st.just("")),
    ),
    max_size=24,
)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(ops=OPS)
def test_never_out_of_order_and_never_past_a_deadline(
    store: BrokerStore, clock: FakeClock, sink: MemorySink, ops: list[tuple[str, object, object]]
) -> None:
    d = Device_(store, clock, sink)
    for op, flag, arg in ops:
        if op == "pub":
            d.pub(bool(flag), str(arg))
        elif op == "tick":
            clock.advance(float(flag))  # type: ignore[arg-type]
            d.broker.release_due()
        elif op == "net":
            d.network(str(arg))
        else:
            d.ack()
        d.take()
        now = clock()
        assert len(set(d.received)) == len(d.received)  # nothing twice
        ordered = d.of(d.ordered)
        # In order: what the ordered subscription received is a prefix of what it had.
        mine = [n for n, (sub, _, _) in sorted(d.published.items()) if sub == d.ordered]
        assert ordered == mine[: len(ordered)]
        for nseq, (_, qclass, at) in d.published.items():
            if nseq not in d.received:  # still held: never past its deadline
                assert now < at + CLASSES[qclass].max_delay, (nseq, qclass, now - at)
    d.network("wifi")
    d.take()
    assert sorted(d.received) == sorted(d.published)  # nothing lost
