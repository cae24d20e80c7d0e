"""Acceptance through the impairment proxy on loopback, and disconnection/return."""

from __future__ import annotations

import argparse
import asyncio
import random
import time

import pytest

from rudp import PeerUnreachable, RudpConfig
from rudp.aio import RudpEndpoint
from rudp.impair import Impairment, ImpairmentProxy, Link, parse_addr, parse_rate

KEY = bytes(range(100, 132))
LOOP = ("127.0.0.1", 0)


@pytest.mark.slow
async def test_10000_messages_through_lossy_proxy_exactly_once_in_order() -> None:
    config = RudpConfig(window=512, rto_initial=0.3, rto_min=0.1, max_retries=20)
    impairment = Impairment(loss=0.10, dup=0.05, reorder=0.05, delay=0.020, jitter=0.010)
    a = await RudpEndpoint.open("127.0.0.1", config=config)
    b = await RudpEndpoint.open("127.0.0.1", config=config)
    proxy = ImpairmentProxy(listen=LOOP, forward=b.local_addr, impairment=impairment, seed=7)
    await proxy.start()
    try:
        pa = a.peer(KEY, proxy.listen_addr)
        pb = b.peer(KEY, ("127.0.0.1", 9))  # learnt from the first authenticated packet
        n = 10_000
        messages = [f"message {i:05d} ".encode() * 4 for i in range(n)]
        started = time.perf_counter()
        sending = asyncio.gather(*(pa.send(m) for m in messages))
        received = []
        async with asyncio.timeout(90):
            for _ in range(n):
                received.append(await pb.receive())
            await sending
        elapsed = time.perf_counter() - started
        assert received == messages
        with pytest.raises(TimeoutError):  # late duplicates in the proxy must not surface
            await asyncio.wait_for(pb.receive(), 0.2)
        up, _ = proxy.stats
        s = pa.stats
        print(
            f"\n10000 msgs in {elapsed:.2f} s: {n / elapsed:.0f} msg/s, "
            f"{sum(map(len, messages)) / elapsed / 1e6:.3f} MB/s; "
            f"data packets {s.data_sent}, retransmissions {s.retransmissions} "
            f"(fast {s.fast_retransmissions}, timeouts {s.timeouts}); "
            f"proxy up dropped {up.dropped} dup {up.duplicated} reordered {up.reordered}; "
            f"receiver duplicates {pb.stats.duplicates}, replays {pb.stats.replayed}"
        )
        assert s.retransmissions >= up.dropped // 2
        assert up.dropped > 0 and up.duplicated > 0 and up.reordered > 0
    finally:
        await proxy.close()
        await a.close()
        await b.close()


async def test_disconnect_fails_at_computed_time_then_resumes_from_new_address() -> None:
    config = RudpConfig(
        rto_initial=0.2, rto_min=0.1, backoff=2.0, max_retries=3, keepalive_interval=0
    )
    a = await RudpEndpoint.open("127.0.0.1", config=config)
    b = await RudpEndpoint.open("127.0.0.1", config=config)
    try:
        pa = a.peer(KEY, b.local_addr)
        pb = b.peer(KEY, a.local_addr)
        disconnected: list[PeerUnreachable] = []
        pa.on_disconnected = disconnected.append
        async with asyncio.timeout(10):
            for i in range(5):
                await pa.send(b"before %d" % i)
                assert await pb.receive() == b"before %d" % i
        # The peer goes away: it hears nothing (so it sends nothing either).
        b.drop_incoming = True
        rto = pa.connection.rto.rto
        expected = sum(min(rto * 2.0**i, config.rto_max) for i in range(config.max_retries + 1))
        messages = [b"during %d" % i for i in range(3)]
        failed: list[bytes] = []
        started = asyncio.get_running_loop().time()
        results = await asyncio.wait_for(
            asyncio.gather(*(pa.send(m) for m in messages), return_exceptions=True), 10
        )
        elapsed = asyncio.get_running_loop().time() - started
        for result in results:
            assert isinstance(result, PeerUnreachable)
            assert result.message is not None
            failed.append(result.message)
        assert failed == messages  # in order, so the caller can requeue them
        assert expected * 0.9 <= elapsed <= expected * 1.1, (elapsed, expected)
        assert not pa.connected and len(disconnected) == 1
        # The peer comes back from a new address and authenticates by talking.
        await b.rebind("127.0.0.1")
        b.drop_incoming = False
        async with asyncio.timeout(10):
            await pb.send(b"I am back")
            assert await pa.receive() == b"I am back"
            assert pa.addr == b.local_addr
            pa.reset()
            for m in [*failed, b"after"]:
                await pa.send(m)
            got = [await pb.receive() for _ in range(4)]
        assert got == [*messages, b"after"]
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(pb.receive(), 0.1)
    finally:
        await a.close()
        await b.close()


async def test_proxy_is_deterministic_with_a_seed() -> None:
    def fates(seed: int) -> list[int]:
        d = Link(random.Random(seed), Impairment(loss=0.3, dup=0.2))
        return [len(d.schedule(0.0, 100)) for _ in range(200)]

    assert fates(3) == fates(3)
    assert fates(3) != fates(4)
    assert 0 in fates(3) and 2 in fates(3)


def test_proxy_command_line_parses_the_documented_options() -> None:
    assert parse_rate("1mbit") == 1e6
    assert parse_rate("512kbit") == 512e3
    assert parse_rate("2000") == 2000.0
    assert parse_addr("127.0.0.1:9000") == ("127.0.0.1", 9000)
    assert parse_addr("[::1]:9001") == ("::1", 9001)
    with pytest.raises(argparse.ArgumentTypeError):
        parse_rate("fast")
    with pytest.raises(argparse.ArgumentTypeError):
        parse_addr("9000")


def test_link_rate_and_delay_schedule() -> None:
    link = Link(random.Random(1), Impairment(delay=0.02, rate=1e6))
    # 1250 bytes at 1 Mbit/s take 10 ms on the wire, then 20 ms of delay; the next queues.
    assert link.schedule(0.0, 1250) == [pytest.approx(0.03)]
    assert link.schedule(0.0, 1250) == [pytest.approx(0.04)]
