"""Several frames per datagram: what is due together shares datagrams."""

from __future__ import annotations

import asyncio

from rudp import RudpConfig
from rudp.aio import RudpEndpoint
from rudp.connection import MessageAcked, MessageReceived, RudpConnection

KEY = b"p" * 32
CONFIG = RudpConfig(mtu=300, keepalive_interval=0, ack_every=1)


def _received(conn: RudpConnection) -> list[bytes]:
    out = []
    while (event := conn.next_event()) is not None:
        if isinstance(event, MessageReceived):
            out.append(event.data)
    return out


def test_small_messages_due_together_share_datagrams_up_to_the_mtu() -> None:
    a = RudpConnection(KEY, CONFIG, sender_id=1)
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    messages = [b"%02d" % i + b"x" * 60 for i in range(10)]  # 62 bytes + 15 of DATA frame
    for m in messages:
        a.send_message(m, 0.0)
    sent = a.datagrams_to_send(0.0)
    # 300 - 18 (header) - 16 (tag) = 266 bytes of frames: three 77-byte frames each.
    assert [len(d) for d in sent] == [265, 265, 265, 111]
    assert a.stats.packets_sent == 4 and a.stats.data_sent == 10
    for d in sent:
        assert b.receive_datagram(d, 0.01)
    assert _received(b) == messages
    # The receiver owes one ACK per datagram at most (ack_every=1), not one per message.
    assert len(b.datagrams_to_send(0.01)) == 1


def test_a_due_ack_rides_with_data() -> None:
    a = RudpConnection(KEY, CONFIG, sender_id=1)
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    a.send_message(b"question", 0.0)
    (d,) = a.datagrams_to_send(0.0)
    b.receive_datagram(d, 0.01)
    b.send_message(b"answer", 0.01)
    (reply,) = b.datagrams_to_send(0.01)  # DATA and the ACK of "question" together
    assert b.stats.acks_sent == 1 and b.stats.data_sent == 1
    a.receive_datagram(reply, 0.02)
    events = []
    while (event := a.next_event()) is not None:
        events.append(event)
    assert events == [MessageReceived(b"answer"), MessageAcked(0)]


def test_a_lost_packed_datagram_is_resent_whole_and_delivered_once() -> None:
    a = RudpConnection(KEY, CONFIG, sender_id=1)
    b = RudpConnection(KEY, CONFIG, sender_id=2)
    for i in range(4):
        a.send_message(b"m%d" % i, 0.0)
    (lost,) = a.datagrams_to_send(0.0)
    assert lost
    a.handle_timer(a.get_timer() or 0.0)  # the RTO: everything not SACKed goes again
    resent = a.datagrams_to_send(1.0)
    assert len(resent) == 1 and a.stats.retransmissions == 4
    b.receive_datagram(resent[0], 1.01)
    assert _received(b) == [b"m0", b"m1", b"m2", b"m3"]


async def test_sends_of_one_loop_turn_share_a_datagram() -> None:
    a = await RudpEndpoint.open("127.0.0.1")
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        sends = [asyncio.ensure_future(pa.send(b"n%d" % i)) for i in range(20)]
        await asyncio.wait_for(asyncio.gather(*sends), 5)
        got = [await asyncio.wait_for(pb.receive(), 5) for _ in range(20)]
        assert got == [b"n%d" % i for i in range(20)]
        assert pa.stats.data_sent == 20
        assert pa.stats.packets_sent == 1  # 20 tiny messages in one datagram
        assert b.stats.datagrams_received == 1
    finally:
        await a.close()
        await b.close()
