"""L and V are measured live. RUDP loss lowers IP's V (a moving average) until
SMS wins for an urgent notification; SMS delivery reports move SMS's figures."""

from __future__ import annotations

from mdeci.broker.sink import MemorySink
from mdeci.broker.sms import RECENT_MO, SmsFallback
from mdeci.channels import Outgoing, SendNow, select
from mdeci.channels.config import ChannelsConfig
from mdeci.channels.live import Figures, LiveFigures
from mdeci.sms.gateway import SimulatedNetwork
from mdeci.sms.link import FrameReceived
from mdeci.store.repo import BrokerStore
from tests.broker.conftest import FakeClock
from tests.smsint.harness import ALICE, BROKER_NO, sms_config

MSG = Outgoing(user=ALICE, qclass="urgent", size=170, first_seen=0.0)


def _best(fallback: SmsFallback, now: float) -> str:
    decision = select(
        fallback.policy(ALICE), MSG, available={"ip", "sms"}, usage=fallback.usage, now=now
    )
    assert isinstance(decision, SendNow)
    return decision.channel.name


def test_rudp_loss_flips_the_decision_to_sms_and_back(store: BrokerStore, clock: FakeClock) -> None:
    fallback = SmsFallback(
        store,
        sms_config(),
        SimulatedNetwork().gateway(BROKER_NO),
        MemorySink(),
        clock,
        channels=ChannelsConfig(alpha=0.2),
    )
    assert _best(fallback, clock()) == "ip"
    sent = retrans = 0
    samples = 0
    while _best(fallback, clock()) == "ip":
        sent += 100
        retrans += 98  # 98% of the packets needed a retransmission
        fallback.observe_ip(ALICE, 40.0, sent, retrans)
        samples += 1
        assert samples < 50
    ip = fallback.live.get(ALICE, "ip")
    assert ip.coverage < 0.1 and ip.latency_ms < 250.0  # RTT 40 ms pulled L down too
    assert samples > 5  # a moving average: one bad sample is not enough
    while _best(fallback, clock()) == "sms":
        sent += 100  # a clean stretch
        fallback.observe_ip(ALICE, 40.0, sent, retrans)
        samples += 1
        assert samples < 100
    assert fallback.live.get(ALICE, "ip").coverage > 0.09


def test_a_new_association_restarts_the_counters(store: BrokerStore, clock: FakeClock) -> None:
    fallback = SmsFallback(
        store, sms_config(), SimulatedNetwork().gateway(BROKER_NO), MemorySink(), clock
    )
    fallback.observe_ip(ALICE, None, 1000, 0)
    before = fallback.live.get(ALICE, "ip").coverage
    fallback.observe_ip(ALICE, None, 10, 10)  # fewer than before: a new RUDP association
    assert fallback.live.get(ALICE, "ip").coverage < before


def test_sms_delivery_reports_move_latency_and_reliability() -> None:
    live = LiveFigures({"sms": Figures(10_000.0, 1.0)}, alpha=0.5)
    live.latency("u", "sms", 2_000.0)
    assert live.get("u", "sms").latency_ms == 6_000.0
    live.delivered("u", "sms", 0.0)  # an expired buffer
    assert live.get("u", "sms").coverage == 0.5
    live.delivered("u", "sms", 0.0, weight=10)  # capped at one full step
    assert live.get("u", "sms").coverage == 1e-3  # the floor: ln(1/V) stays finite
    assert live.get("v", "sms") == Figures(10_000.0, 1.0)


def test_sms_from_anybody_cannot_grow_the_broker(store: BrokerStore, clock: FakeClock) -> None:
    """Probe: 1,000 MO frames from unknown numbers; the broker keeps only the latest."""
    sink = MemorySink()
    fallback = SmsFallback(store, sms_config(), SimulatedNetwork().gateway(BROKER_NO), sink, clock)
    for i in range(1000):
        # What the link runner hands over for each reassembled MO frame.
        fallback._on_event(FrameReceived(sender=f"+1555{i:07d}", frame=b"junk"))
    assert len(fallback.received) == RECENT_MO
    assert fallback.received[-1][0] == "+15550000999"
    assert len(sink.named("sms_received")) == 1000  # each one logged
