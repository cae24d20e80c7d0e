"""FlooredReno against aioquic's NewReno, packet by packet: a loss episode halves
NewReno's window down to two packets, never FlooredReno's below RUDP's window; both
collapse on persistent congestion, and the floor holds again only once the window grew
back to it."""

from __future__ import annotations

from aioquic.quic.congestion.base import (
    K_MINIMUM_WINDOW,
    QuicCongestionControl,
    create_congestion_control,
)
from aioquic.quic.packet import QuicPacketType
from aioquic.quic.packet_builder import QuicSentPacket
from aioquic.tls import Epoch
from hypothesis import given, settings
from hypothesis import strategies as st

from quicdata.congestion import FLOOR_PACKETS, FLOORED_RENO, FlooredReno
from quicdata.connection import DEFAULT_CONFIG

SIZE = 1252  # aioquic's datagrams on this path


def _packet(number: int, sent_time: float) -> QuicSentPacket:
    return QuicSentPacket(
        epoch=Epoch.ONE_RTT,
        in_flight=True,
        is_ack_eliciting=True,
        is_crypto_packet=False,
        packet_number=number,
        packet_type=QuicPacketType.ONE_RTT,
        sent_time=sent_time,
        sent_bytes=SIZE,
    )


def _lose_one_per_episode(cc: QuicCongestionControl, episodes: int, after: float = 0.0) -> None:
    for k in range(episodes):
        packet = _packet(1000 + k, sent_time=after + k + 0.5)
        cc.on_packet_sent(packet=packet)
        cc.on_packets_lost(now=after + k + 1, packets=[packet])


def test_the_data_channel_uses_it_by_default() -> None:
    assert DEFAULT_CONFIG.congestion == FLOORED_RENO
    assert isinstance(create_congestion_control(FLOORED_RENO, max_datagram_size=SIZE), FlooredReno)


def test_random_losses_halve_reno_to_two_packets_but_not_below_the_floor() -> None:
    reno = create_congestion_control("reno", max_datagram_size=SIZE)
    floored = FlooredReno(max_datagram_size=SIZE)
    assert floored.congestion_window == FLOOR_PACKETS * SIZE  # RUDP's window from the start
    _lose_one_per_episode(reno, 10)
    _lose_one_per_episode(floored, 10)
    assert reno.congestion_window == K_MINIMUM_WINDOW * SIZE
    assert floored.congestion_window == FLOOR_PACKETS * SIZE
    assert floored.bytes_in_flight == 0


def test_persistent_congestion_collapses_it_until_the_window_grows_back() -> None:
    cc = FlooredReno(max_datagram_size=SIZE)
    cc.on_persistent_congestion()
    assert cc.congestion_window == K_MINIMUM_WINDOW * SIZE
    _lose_one_per_episode(cc, 3)  # no floor now: NewReno's own minimum
    assert cc.congestion_window == K_MINIMUM_WINDOW * SIZE
    # Grown back past the floor (NewReno's slow start, then avoidance), it holds again.
    number, now = 100, 10.0
    while cc.congestion_window < FLOOR_PACKETS * SIZE:
        packet = _packet(number, sent_time=now)
        cc.on_packet_sent(packet=packet)
        cc.on_packet_acked(now=now + 0.01, packet=packet)
        number, now = number + 1, now + 0.02
    _lose_one_per_episode(cc, 5, after=now)
    assert cc.congestion_window == FLOOR_PACKETS * SIZE


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["ack", "lose", "collapse"]), max_size=200))
def test_never_below_the_floor_unless_collapsed(
    steps: list[str],
) -> None:
    cc = FlooredReno(max_datagram_size=SIZE)
    collapsed = False
    now = 0.0
    for number, step in enumerate(steps):
        now += 0.01
        packet = _packet(number, sent_time=now)
        cc.on_packet_sent(packet=packet)
        if step == "ack":
            cc.on_packet_acked(now=now + 0.005, packet=packet)
        elif step == "lose":
            cc.on_packets_lost(now=now + 0.005, packets=[packet])
        else:
            cc.on_persistent_congestion()
            collapsed = True
        if collapsed and cc.congestion_window >= FLOOR_PACKETS * SIZE:
            collapsed = False
        if not collapsed:
            assert cc.congestion_window >= FLOOR_PACKETS * SIZE
        assert cc.congestion_window >= K_MINIMUM_WINDOW * SIZE
        assert cc.bytes_in_flight >= 0
