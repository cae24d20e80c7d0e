"""The broker core's network holds on a migrated store with a fake clock: a held
notification is skipped while later ones go, the store's ack stays below it, and it goes
on the device's next network, at its deadline, or across a reconnection."""

from __future__ import annotations

import dataclasses

import pytest

from mdeci.broker import MemorySink, network_holds
from mdeci.broker.glue import Broker
from mdeci.broker.network_holds import NetworkHolds
from mdeci.channels.config import default_class_configs
from mdeci.channels.networks import THESIS_NETWORKS
from mdeci.frames import Ack, Calendar, CalendarOk, CalendarRule, Device, Pub, PubOk, encode
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock, add_session, make_broker
from tests.broker.core_helpers import ALICE, PUBLISHER, notifies, one, queued, subscribe

BULK_DMAX = 100.0


def holding_broker(store: BrokerStore, clock: FakeClock, sink: MemorySink) -> Broker:
    broker = make_broker(store, clock, sink)
    classes = {c.name: c.policy() for c in default_class_configs()}
    classes["bulk"] = dataclasses.replace(classes["bulk"], max_delay=BULK_DMAX)
    broker.classes = frozenset(classes)
    broker.core.holds = NetworkHolds(THESIS_NETWORKS, classes, sink, clock)
    add_session(store, ALICE)
    subscribe(broker, ALICE, "a.#")
    rules = (CalendarRule(channel="wifi", p=0.5),)
    assert isinstance(
        one(broker.handle_frame(ALICE, encode(Calendar(req=2, rules=rules)))), CalendarOk
    )
    assert broker.handle_frame(ALICE, encode(Device(network="cellular"))) == []
    return broker


def pub(broker: Broker, msg_id: str, qclass: str = "") -> None:
    frame = Pub(req=7, msg_id=msg_id, subject="a.b", payload=b"x", qclass=qclass)
    assert isinstance(one(broker.handle_frame(PUBLISHER, encode(frame))), PubOk)


def test_held_row_is_skipped_and_the_ack_stays_below_it(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = holding_broker(store, clock, sink)
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
    pub(broker, "big", "bulk")
    pub(broker, "n1")
    pub(broker, "n2")
    assert [n.nseq for n in notifies(broker, ALICE)] == [2, 3]  # 1 is held
    broker.handle_frame(ALICE, encode(Ack(upto=3)))
    broker.flush_acks()
    # The agent's ack covers 1..3; the broker keeps 1 (held), and 2..3 wait with it.
    assert [q[0] for q in queued(store, ALICE)] == [1, 2, 3]
    assert notifies(broker, ALICE) == []
    # Wi-Fi: the held one goes at once, and only it.
    assert broker.handle_frame(ALICE, encode(Device(network="wifi"))) == []
    assert [n.nseq for n in notifies(broker, ALICE)] == [1]
    broker.handle_frame(ALICE, encode(Ack(upto=1)))
    broker.flush_acks()
    assert queued(store, ALICE) == []
    costs = [e.fields["cost"] for e in sink.named("channel_decided") if e.fields["nseq"] == 1]
    assert isinstance(costs[0], float) and costs[0] > 0 and costs[-1] == 0.0  # saved: costs[0]
    reasons = [str(e.fields["reason"]) for e in sink.named("channel_decided")]
    assert reasons[0].startswith("network=cellular class=bulk decision=wait for=wifi")
    assert reasons[-1] == "network=wifi class=bulk decision=deliver"


def test_deadline_and_reconnection(store: BrokerStore, clock: FakeClock, sink: MemorySink) -> None:
    broker = holding_broker(store, clock, sink)
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
    pub(broker, "big", "bulk")
    pub(broker, "n1")
    assert [n.nseq for n in notifies(broker, ALICE)] == [2]
    broker.handle_frame(ALICE, encode(Ack(upto=2)))
    # A reconnection: 2 was acknowledged (not sent again), 1 is still held.
    broker.mark_disconnected(ALICE, "test")
    broker.mark_connected(ALICE, ("127.0.0.1", 4001))
    assert notifies(broker, ALICE) == []
    clock.advance(0.5 * BULK_DMAX - 0.001)
    broker.release_due()
    assert notifies(broker, ALICE) == []
    clock.advance(0.001)  # P x Dmax: the costly network is the best there is
    broker.release_due()
    assert [n.nseq for n in notifies(broker, ALICE)] == [1]
    broker.handle_frame(ALICE, encode(Ack(upto=1)))
    broker.flush_acks()
    assert queued(store, ALICE) == []


def test_a_held_row_gone_another_way_does_not_keep_the_acks_back(
    store: BrokerStore, clock: FakeClock, sink: MemorySink
) -> None:
    broker = holding_broker(store, clock, sink)
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
    pub(broker, "big", "bulk")
    pub(broker, "n1")
    assert [n.nseq for n in notifies(broker, ALICE)] == [2]
    # Delivered by SMS (the SMS side removes exactly that row and tells the delivery).
    assert store.queues.remove(ALICE, 1)
    broker.core.delivered_elsewhere(ALICE, 1)
    broker.handle_frame(ALICE, encode(Ack(upto=2)))
    broker.flush_acks()
    assert queued(store, ALICE) == []


def test_a_held_row_goes_before_it_falls_out_of_the_agents_window(
    store: BrokerStore, clock: FakeClock, sink: MemorySink, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(network_holds, "MAX_HOLD_SPAN", 2)
    broker = holding_broker(store, clock, sink)
    broker.mark_connected(ALICE, ("127.0.0.1", 4000))
    pub(broker, "big", "bulk")
    for n in range(4):
        pub(broker, f"n{n}")
    # 2 and 3 go; 4 is more than 2 above the held 1: 1 goes after this take.
    assert [n.nseq for n in notifies(broker, ALICE)] == [2, 3, 4, 5]
    assert [n.nseq for n in notifies(broker, ALICE)] == [1]
    ones = [str(e.fields["reason"]) for e in sink.named("channel_decided") if e.fields["nseq"] == 1]
    assert ones[0].startswith("network=cellular class=bulk decision=wait")
    assert ones[1] == "network=cellular class=bulk decision=deliver why=reorder_window"
