"""``python -m sip registrar`` with worker processes: bindings live in one
SQLite file, so a REGISTER taken by one worker is seen through any other."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

from sip.tools.bindings import fetch
from tests.sip.interop.tools import Tool


def register(user: str, n: int, contact_port: int) -> bytes:
    return (
        f"REGISTER sip:example.org SIP/2.0\r\n"
        f"Via: SIP/2.0/UDP 127.0.0.1:{contact_port};branch=z9hG4bK-w{n};rport\r\n"
        f"From: <sip:{user}@example.org>;tag=w{n}\r\nTo: <sip:{user}@example.org>\r\n"
        f"Call-ID: w{n}@test\r\nCSeq: 1 REGISTER\r\n"
        f"Contact: <sip:{user}@127.0.0.1:{contact_port}>\r\nExpires: 600\r\n"
        "Content-Length: 0\r\n\r\n"
    ).encode()


# A UDP client's retransmission schedule (RFC 3261 Timer E: T1 doubling), within 10 s.
RETRANSMIT = (0.5, 1.0, 2.0, 4.0, 2.5)


async def send_register(dest: tuple[str, int], user: str, n: int, copies: int = 1) -> list[bytes]:
    """One REGISTER (sent ``copies`` times, as retransmissions) from a socket of its own,
    so from a source port of its own; the answer to each copy. Unanswered, a copy is sent
    again on Timer E's schedule, as a SIP client over UDP does (the same bytes: the same
    transaction, whose answer is the same)."""
    loop = asyncio.get_running_loop()
    replies = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.setblocking(False)
        data = register(user, n, sock.getsockname()[1])
        for _ in range(copies):
            replies.append(await _exchange(loop, sock, data, dest))
    return replies


async def _exchange(
    loop: asyncio.AbstractEventLoop, sock: socket.socket, data: bytes, dest: tuple[str, int]
) -> bytes:
    receiving = asyncio.ensure_future(loop.sock_recvfrom(sock, 65535))
    try:
        for wait in RETRANSMIT:
            await loop.sock_sendto(sock, data, dest)
            done, _ = await asyncio.wait({receiving}, timeout=wait)
            if done:
                reply, _ = receiving.result()
                return reply
        raise TimeoutError(f"no answer to a REGISTER sent {len(RETRANSMIT)} times")
    finally:
        receiving.cancel()


def children(pid: int) -> list[int]:
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


async def test_a_binding_stored_through_one_registrar_is_seen_through_another(
    tmp_path: Path,
) -> None:
    store = tmp_path / "bindings.db"
    first = Tool("registrar", "--listen", "127.0.0.1:0", "--store", str(store))
    second = Tool("registrar", "--listen", "127.0.0.1:0", "--store", str(store))
    try:
        [reply] = await send_register(first.addr, "carol", 1)
        assert reply.startswith(b"SIP/2.0 200 OK")
        contacts = await fetch(second.addr, "sip:carol@example.org")
        assert len(contacts) == 1 and contacts[0].startswith("sip:carol@127.0.0.1:")
        assert await fetch(second.addr, "sip:nobody@example.org") == []
    finally:
        first.stop()
        second.stop()


async def test_workers_share_the_port_and_the_bindings(tmp_path: Path) -> None:
    tool = Tool("registrar", "--listen", "127.0.0.1:0", "--workers", "2", "--quiet")
    try:
        assert "2 workers" in tool.seen[-1]
        assert len(children(tool.process.pid)) == 2
        users = [f"w{n}" for n in range(16)]
        # Each REGISTER and each query from a socket of its own: the kernel spreads the
        # sources over both workers, and every query must find its user's binding.
        replies = await asyncio.gather(
            *(send_register(tool.addr, u, n) for n, u in enumerate(users))
        )
        assert all(r.startswith(b"SIP/2.0 200 OK") for [r] in replies)
        found = await asyncio.gather(*(fetch(tool.addr, f"sip:{u}@example.org") for u in users))
        assert [len(c) for c in found] == [1] * len(users)
    finally:
        tool.stop()
    assert tool.process.returncode == 0


async def test_a_retransmission_reaches_the_worker_that_answered_it(tmp_path: Path) -> None:
    # Workers are picked by the datagram's bytes, not its sender: the same bytes must
    # find the same worker (another one would process it anew and answer 500, §10.3
    # step 7), whichever sockets the requests come from.
    tool = Tool("registrar", "--listen", "127.0.0.1:0", "--workers", "2", "--quiet")
    try:
        answers = await asyncio.gather(
            *(send_register(tool.addr, f"r{n}", 100 + n, copies=3) for n in range(12))
        )
        for first, *again in answers:
            assert first.startswith(b"SIP/2.0 200 OK")
            assert again == [first, first]
    finally:
        tool.stop()
