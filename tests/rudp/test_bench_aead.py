"""Benchmark: RUDP with AEAD against the integrity-only reference.

Run: ``.venv/bin/pytest -m bench -s tests/rudp/test_bench_aead.py``. Both protections run
in the same process and the same run, interleaved (A B A B ...), so machine load hits
both alike; the ratio is what counts. Two measurements:

- core: two sans-IO connections wired in memory (no sockets, no event loop): CPU
  seconds per datagram, sealing and opening included;
- sockets: two ``RudpEndpoint`` on loopback (no proxy): goodput of 1 KB messages.

INTEGRITY_ONLY is version 1's scheme (HMAC-SHA256/16 over clear frames) in the v2
layout; it is not reachable from any configuration (rudp.packet.Protection).
"""

from __future__ import annotations

import asyncio
import statistics
import time

import pytest

from rudp import MessageReceived, RudpConfig, RudpConnection
from rudp.aio import RudpEndpoint
from rudp.packet import Protection

KEY = bytes(range(32))
ROUNDS = 5
CORE_MESSAGES = 4000
SOCKET_MESSAGES = 3000
SIZE = 1024


def core_run(protection: Protection) -> tuple[float, int]:
    """CPU seconds and datagrams for CORE_MESSAGES messages a -> b, ACKs back."""
    config = RudpConfig(window=512, keepalive_interval=0)
    a = RudpConnection(KEY, config, sender_id=1, protection=protection)
    b = RudpConnection(KEY, config, sender_id=2, protection=protection)
    message = b"m" * SIZE
    now, got, datagrams = 0.0, 0, 0
    start = time.process_time()
    for _ in range(CORE_MESSAGES):
        a.send_message(message, now)
    while got < CORE_MESSAGES:
        now += 0.001
        for d in a.datagrams_to_send(now):
            datagrams += 1
            b.receive_datagram(d, now)
        b.handle_timer(now)
        for d in b.datagrams_to_send(now):
            datagrams += 1
            a.receive_datagram(d, now)
        while (e := b.next_event()) is not None:
            got += isinstance(e, MessageReceived)
    return time.process_time() - start, datagrams


async def socket_run(protection: Protection) -> tuple[float, float]:
    """Wall and CPU seconds for SOCKET_MESSAGES messages over loopback sockets."""
    config = RudpConfig(window=512, rto_initial=0.3, rto_min=0.05)
    a = await RudpEndpoint.open("127.0.0.1", config=config, protection=protection)
    b = await RudpEndpoint.open("127.0.0.1", config=config, protection=protection)
    try:
        pa, pb = a.peer(KEY, b.local_addr), b.peer(KEY, a.local_addr)
        message = b"m" * SIZE
        wall, cpu = time.perf_counter(), time.process_time()
        sending = asyncio.gather(*(pa.send(message) for _ in range(SOCKET_MESSAGES)))
        for _ in range(SOCKET_MESSAGES):
            await pb.receive()
        await sending
        return time.perf_counter() - wall, time.process_time() - cpu
    finally:
        await a.close()
        await b.close()


@pytest.mark.bench
@pytest.mark.timeout(600)
async def test_aead_against_integrity_only() -> None:
    core: dict[Protection, list[float]] = {p: [] for p in Protection}
    wall: dict[Protection, list[float]] = {p: [] for p in Protection}
    cpu: dict[Protection, list[float]] = {p: [] for p in Protection}
    for _ in range(ROUNDS):
        for protection in Protection:
            seconds, datagrams = core_run(protection)
            core[protection].append(seconds / datagrams * 1e6)
            w, c = await socket_run(protection)
            wall[protection].append(w)
            cpu[protection].append(c)
    rows = ["| protection | core µs CPU / datagram | sockets msg/s | sockets MB/s | "
            "sockets CPU µs / msg |", "|---|---|---|---|---|"]  # fmt: skip
    med = statistics.median
    for p in Protection:
        w = med(wall[p])
        rows.append(
            f"| {p.value} | {med(core[p]):.1f} | {SOCKET_MESSAGES / w:.0f} | "
            f"{SOCKET_MESSAGES * SIZE / w / 1e6:.2f} | "
            f"{med(cpu[p]) / SOCKET_MESSAGES * 1e6:.0f} |"
        )
    aead, ref = Protection.AEAD, Protection.INTEGRITY_ONLY
    core_ratio = statistics.median(core[aead]) / statistics.median(core[ref])
    goodput_ratio = statistics.median(wall[aead]) / statistics.median(wall[ref])
    cpu_ratio = statistics.median(cpu[aead]) / statistics.median(cpu[ref])
    print("\n" + "\n".join(rows))
    print(
        f"AEAD ÷ integrity-only (median of {ROUNDS}): core CPU/datagram {core_ratio:.3f}, "
        f"sockets transfer time {goodput_ratio:.3f}, sockets CPU {cpu_ratio:.3f}"
    )
    assert core_ratio > 0 and goodput_ratio > 0
