"""State a connection or peer builds on first use (a broker holds thousands of idle
ones) works from its first use on: the first loss, a failure, the first message."""

from __future__ import annotations

import asyncio
import gc
import hmac
import sys
import tracemalloc
from collections.abc import Callable

import pytest
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from rudp import RudpConfig, RudpStats
from rudp import packet as wire
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.connection import RudpConnection
from rudp.fields import NO_ENTRIES

from .sim import Net, pair

CONFIG = RudpConfig(rto_initial=0.2, rto_min=0.05, max_retries=3, keepalive_interval=0)
KEY = b"k" * 32


def test_no_instance_dict_and_nothing_queued_before_use() -> None:
    conn = RudpConnection(KEY, CONFIG, sender_id=1)
    assert not hasattr(conn, "__dict__")
    assert conn.next_event() is None
    assert conn.datagrams_to_send(0.0) == []


def test_first_datagram_lost_then_delivered() -> None:
    net = pair(CONFIG, lambda index: [] if index == 0 else [0.01])
    net.a.send_message(b"first", 0.0)
    net.run_until(lambda: net.acked["a"] == [0])
    assert net.received["b"] == [b"first"]
    assert net.a.stats.retransmissions >= 1


def test_failure_then_reset_sends_again() -> None:
    """A failure empties the send queue; the next message builds it again."""
    cut = True
    net = pair(CONFIG, lambda _: [] if cut else [0.01])
    net.a.send_message(b"lost", 0.0)
    net.run_until(lambda: net.failed["a"] == [0])
    assert not net.a.connected
    cut = False
    net.a.reset(net.now)
    net.a.send_message(b"after", net.now)
    net.run_until(lambda: net.acked["a"] == [1])
    assert net.received["b"] == [b"after"]


async def test_on_message_callback_in_order_and_inbox_only_when_read() -> None:
    a = await RudpEndpoint.open("127.0.0.1")
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        with pytest.raises(AttributeError):
            pb.extra = 1  # type: ignore[attr-defined]
        got: list[bytes] = []
        pb.on_message = got.append
        await asyncio.wait_for(asyncio.gather(*(pa.send(b"m%d" % i) for i in range(20))), 5)
        assert got == [b"m%d" % i for i in range(20)]
        assert pb._inbox is None  # never read with receive(): no queue was built
        pb.on_message = None
        await asyncio.wait_for(pa.send(b"queued"), 5)
        assert await asyncio.wait_for(pb.receive(), 5) == b"queued"
    finally:
        await a.close()
        await b.close()


def test_rare_counters_take_no_slot_until_they_count() -> None:
    stats = RudpStats()
    assert (stats.sparse, stats.bad_tag, stats.tail_probes) == (None, 0, 0)
    stats.bad_tag += 1
    stats.bad_tag += 1
    stats.packets_sent += 1
    assert (stats.bad_tag, stats.replayed, stats.packets_sent) == (2, 0, 1)
    assert stats.sparse == {"bad_tag": 2} and "sparse={'bad_tag': 2}" in repr(stats)
    assert stats != RudpStats(packets_sent=1)
    with pytest.raises(AttributeError):
        stats.bad_tga = 1  # type: ignore[attr-defined]


async def test_a_peer_builds_its_waiters_and_table_key_on_use() -> None:
    """Nothing waits on an idle peer (the waiters go once the last send is acknowledged),
    it keeps no slot per callback nor for the key (its connection's), and the endpoint's
    table shares its cid int."""
    a = await RudpEndpoint.open("127.0.0.1")
    b = await RudpEndpoint.open("127.0.0.1")
    try:
        pa = a.peer(KEY, b.local_addr)
        assert pa.key is pa.connection.key == KEY and sys.getsizeof(pa) <= 104  # nine slots
        b.peer(KEY, a.local_addr)
        idle, callbacks = pa._waiters, pa.sparse
        assert idle is None and callbacks is None and pa.on_message is None
        assert next(iter(a._peers)) is pa.connection.cid
        got: list[bytes] = []
        pa.on_message = got.append
        assert pa.on_message == got.append and pa.on_heard is None
        assert pa.sparse == {"on_message": got.append}
        sent = pa.send_nowait(b"one")
        busy = pa._waiters
        assert busy is not None and len(busy) == 1
        await asyncio.wait_for(sent, 5)
        assert pa._waiters is None  # given back once nothing waits
    finally:
        await a.close()
        await b.close()


def test_keys_hold_no_cipher_context_and_survive_its_eviction() -> None:
    """AES-GCM contexts live in a bounded cache shared by all keys, not in each key:
    a key whose context was dropped builds it again on its next packet."""
    sender = wire.SenderKeys(KEY, 7, wire.Protection.AEAD)
    receiver = wire.SenderKeys(KEY, 7, wire.Protection.AEAD)
    assert not any(isinstance(getattr(sender, name), AESGCM) for name in sender.__slots__)
    header = wire.push_header(wire.Header(1, 7, 0))
    datagram = sender.seal(header, 0, b"payload")
    wire._aead.cache_clear()
    assert receiver.open(datagram, 0) == b"payload"
    assert receiver.open(datagram[:-1] + bytes([datagram[-1] ^ 1]), 0) is None
    assert wire._aead.cache_info().maxsize == wire.AEAD_CONTEXTS


def test_keys_seal_as_the_key_schedule_says() -> None:
    """The key and IV kept as one int still seal under docs/rudp.md's HKDF key and IV
    (the nonce is the IV xor the packet number), and the HMAC reference under its key."""
    sender = 0x01020304
    for protection in wire.Protection:
        material = HKDF(
            algorithm=hashes.SHA256(),
            length=44,
            salt=b"mdeci-rudp v2",
            info=b"mdeci-rudp sender \x01\x02\x03\x04" + protection.value.encode(),
        ).derive(KEY)
        key, iv = material[:32], int.from_bytes(material[32:], "big")
        keys = wire.SenderKeys(KEY, sender, protection)
        assert keys.protection is protection
        header = wire.push_header(wire.Header(9, sender, 0x1234))
        sealed = keys.seal(header, 0x1234, b"payload")
        if protection is wire.Protection.AEAD:
            nonce = (iv ^ 0x1234).to_bytes(12, "big")
            assert sealed == header + AESGCM(key).encrypt(nonce, b"payload", header)
        else:
            data = header + b"payload"
            assert sealed == data + hmac.digest(key, data, "sha256")[:16]
        assert keys.open(sealed, 0x1234) == b"payload"


def test_an_idle_connection_gives_back_its_tables() -> None:
    """After a burst is acknowledged, the sender's tables hold no memory of its size."""
    net = pair(CONFIG, lambda _: [0.01])
    for i in range(50):
        net.a.send_message(b"m%d" % i, 0.0)
    net.run_until(lambda: len(net.acked["a"]) == 50)
    net.a.datagrams_to_send(net.now)
    net.b.datagrams_to_send(net.now)
    tables: list[object] = [net.a._inflight, net.a._messages, net.b._buffer]
    assert all(table is NO_ENTRIES for table in tables)
    assert net.a._unsent is None and net.a.next_event() is None and net.a._events is None
    assert not NO_ENTRIES
    with pytest.raises(TypeError):
        NO_ENTRIES[0] = b"the shared table is never written"


# Bytes one idle connection holds after a message each way and its keepalives (the
# cipher contexts, a bounded cache shared by all, left out): 1,109 measured (Python
# 3.11); 1,133 with slots of their own for path work and reassembly, 1,157 keeping its
# last receive time, 1,181 with a slot each for the path and restart state, 1,277 with a
# key object per sender, 1,375 with each sender's key and IV apart, 1,551 with a slot for
# every counter and size, 1,730 with empty tables of its own, 2,130 when every queue and
# list exists from the start.
IDLE_BYTES = 1120


def _idle(key: bytes, until: float = 40.0) -> RudpConnection:
    """A connection that carried a message each way and kept alive for ``until`` s."""
    config = RudpConfig(keepalive_interval=15.0)
    net = Net(
        RudpConnection(key, config, sender_id=1),
        RudpConnection(key, config, sender_id=2),
        lambda _: [0.01],
    )
    net.a.send_message(b"x" * 60, 0.0)
    net.run_until(lambda: net.received["b"] != [])
    net.b.send_message(b"y" * 60, net.now)
    net.run_until(lambda: net.acked["a"] == [0] and net.acked["b"] == [0])
    net.run_until(lambda: net.now > until and net.a._rto_deadline is None)  # a PING answered
    net.flush()
    assert net.a.stats.pings_sent >= 1
    return net.a


def _bytes_per_idle(until: float, count: int) -> tuple[float, list[RudpConnection]]:
    """Traced bytes per connection kept alive for ``until`` s, and the connections."""
    _idle(b"\xff" * 32, until)  # the first one builds what all share (caches, code objects)
    wire._aead.cache_clear()
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        kept = [_idle(i.to_bytes(32, "big"), until) for i in range(count)]
        wire._aead.cache_clear()
        gc.collect()
        per = (tracemalloc.get_traced_memory()[0] - before) / count
    finally:
        tracemalloc.stop()
    assert len(kept) == count
    return per, kept


def test_an_idle_connection_holds_under_its_budget() -> None:
    """A broker holds one connection per session: what an idle one keeps is bounded."""
    per, kept = _bytes_per_idle(40.0, 200)
    assert all(c.sparse is None and c.stats.sparse is None for c in kept)
    # Nothing waits for the peer: no time of its own is kept for dead_after (a float each).
    assert all(c._waiting_since == 0.0 for c in kept)
    assert per <= IDLE_BYTES, f"{per:.0f} bytes per idle connection"


# After two hours of keepalives (480 PINGs each way), every counter of packets is past
# the small ints Python shares (0-256) and holds an int object of its own (28 bytes
# each): 1,267 measured alone, 1,292 in the whole suite, with the replay window keeping
# the numbers not seen (0 on a path that loses nothing) and the next packet number read
# off the packets sent; 1,435 with a window of the numbers seen (a bit each, up to
# 1,024) and a counter of its own.
LONG_IDLE_BYTES = 1340


def test_an_idle_connection_stays_under_its_budget_for_hours() -> None:
    per, _ = _bytes_per_idle(7200.0, 30)
    assert per <= LONG_IDLE_BYTES, f"{per:.0f} bytes per connection idle for two hours"


async def test_the_endpoints_one_timer_serves_every_peer() -> None:
    """Keepalives of several peers come due on their endpoint's one timer: no peer holds a
    timer handle of its own."""
    config = RudpConfig(keepalive_interval=0.05)
    a = await RudpEndpoint.open("127.0.0.1", config=config)
    b = await RudpEndpoint.open("127.0.0.1", config=config)
    try:
        keys = [bytes([i]) * 32 for i in range(1, 4)]
        heard = dict.fromkeys(keys, 0)
        done = asyncio.Event()

        def counter(key: bytes) -> Callable[[], None]:
            def on_heard() -> None:
                heard[key] += 1
                if min(heard.values()) >= 3:  # the announce and two keepalives at least
                    done.set()

            return on_heard

        for key in keys:
            b.peer(key, a.local_addr).on_heard = counter(key)
        for key in keys:
            a.peer(key, b.local_addr).announce()
        await asyncio.wait_for(done.wait(), 5)
        assert "_timer" not in RudpPeer.__slots__ and a._timer is not None
        assert all(peer.stats.pings_sent >= 2 for peer in a._peers.values())
    finally:
        await a.close()
        await b.close()
