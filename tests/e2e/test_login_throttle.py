"""The login throttle of a real broker process against a guesser on loopback addresses
of its own (raw UDP sockets, one nonce reused, random usernames, fresh source ports):
the owner gets in every time from her own address, a locked address stays locked on
every port, a flood of keys drops no lock, and the log has one line per failed login up
to its rate, then a summary."""

from __future__ import annotations

import asyncio
import re
import secrets
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from sip.errors import SipRequestFailed
from tests.e2e.harness_b import DOMAIN, GUARD, AgentProcess, BrokerProcess, Device, devices

Addr = tuple[str, int]


class _Answers(asyncio.DatagramProtocol):
    def __init__(self, on_answer: Callable[[bytes], None]) -> None:
        self.on_answer = on_answer

    def datagram_received(self, data: bytes, addr: tuple[str | int, ...]) -> None:
        self.on_answer(data)


class Guesser:
    """Wrong REGISTERs with Digest credentials (a random response: the broker cannot
    tell it from a wrong password) from raw UDP sockets on ``host``."""

    def __init__(self, host: str, broker: Addr, nonce: str = "") -> None:
        self.host, self.broker = host, broker
        self.nonce = nonce
        self.statuses: list[int] = []

    async def _socket(
        self, on_answer: Callable[[bytes], None]
    ) -> tuple[asyncio.DatagramTransport, int]:
        loop = asyncio.get_running_loop()
        transport, _ = await loop.create_datagram_endpoint(
            lambda: _Answers(on_answer), local_addr=(self.host, 0)
        )
        return transport, transport.get_extra_info("sockname")[1]

    def _register(self, user: str, port: int, credentials: bool = True) -> bytes:
        call_id = secrets.token_hex(8)
        auth = (
            f'Authorization: Digest username="{user}", realm="{DOMAIN}", '
            f'nonce="{self.nonce}", uri="sip:{DOMAIN}", response="{secrets.token_hex(32)}", '
            f'algorithm=SHA-256, cnonce="{call_id}", qop=auth, '
            "nc=00000001\r\n"
            if credentials
            # Else smaller than the challenge: the broker would not answer over UDP.
            else f"Padding: {'x' * 400}\r\n"
        )
        return (
            f"REGISTER sip:{DOMAIN} SIP/2.0\r\n"
            f"Via: SIP/2.0/UDP {self.host}:{port};branch=z9hG4bK{call_id};rport\r\n"
            f"Max-Forwards: 70\r\nFrom: <sip:{user}@{DOMAIN}>;tag={call_id}\r\n"
            f"To: <sip:{user}@{DOMAIN}>\r\nCall-ID: {call_id}\r\nCSeq: 1 REGISTER\r\n"
            f"Contact: <sip:{user}@{self.host}:{port}>\r\n{auth}Expires: 600\r\n"
            "Content-Length: 0\r\n\r\n"
        ).encode()

    async def _once(self, user: str, credentials: bool = True) -> bytes:
        """One REGISTER from a fresh socket (a new source port); the answer."""
        got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

        def first(data: bytes) -> None:
            if not got.done():
                got.set_result(data)

        transport, port = await self._socket(first)
        try:
            transport.sendto(self._register(user, port, credentials), self.broker)
            return await asyncio.wait_for(got, GUARD)
        finally:
            transport.close()

    async def challenge(self) -> None:
        """Read a nonce from one challenge (reused for every guess)."""
        answer = (await self._once("nobody", credentials=False)).decode()
        self.nonce = _param(answer, "nonce")

    async def guess(self, *users: str) -> list[int]:
        """One wrong login per user, each from a fresh port; the statuses."""
        got = [_status(await self._once(user)) for user in users]
        self.statuses += got
        return got

    async def flood(self, stop: asyncio.Event, in_flight: int = 16) -> None:
        """Random usernames from one socket, ``in_flight`` unanswered at a time, until
        ``stop`` is set and every one sent is answered."""
        done = asyncio.Event()
        sent = 0

        def on_answer(data: bytes) -> None:
            self.statuses.append(_status(data))
            if not stop.is_set():
                send()
            elif len(self.statuses) == sent:
                done.set()

        def send() -> None:
            nonlocal sent
            sent += 1
            transport.sendto(self._register(secrets.token_hex(6), port), self.broker)

        transport, port = await self._socket(on_answer)
        try:
            for _ in range(in_flight):
                send()
            await stop.wait()
            if len(self.statuses) < sent:
                await asyncio.wait_for(done.wait(), GUARD)
        finally:
            transport.close()


def _param(text: str, name: str) -> str:
    found = re.search(rf'{name}="([^"]*)"', text)
    assert found is not None, text
    return found.group(1)


def _status(data: bytes) -> int:
    return int(data.split(b" ", 2)[1])


def _log(broker: BrokerProcess, event: str) -> list[str]:
    return [
        line for line in broker.stderr.decode().splitlines() if f" event={event} " in f"{line} "
    ]


async def _register(dev: Device, broker: BrokerProcess) -> None:
    await asyncio.wait_for(dev.ua.register(broker.sip_addr, 600), GUARD)


async def _refused(register: Awaitable[None]) -> None:
    with pytest.raises(SipRequestFailed) as refused:
        await register
    assert refused.value.status == 401


async def test_guessers_neither_lock_the_owner_out_nor_escape_their_locks(
    tmp_path: Path,
) -> None:
    """One broker (a process start costs seconds), three parts: a flood of guesses while
    alice moves; fresh ports and a flood of keys past ``max_keys``; the log."""
    broker = await BrokerProcess(
        tmp_path / "broker", extra="[auth.throttle]\nmax_keys = 4\nlog_burst = 10\n"
    ).start()
    try:
        async with devices() as opened:
            flood = await _alice_moves_during_a_flood(broker, opened)
            others = await _locks_hold(broker, opened)
    finally:
        assert await broker.stop() == 0
    failed = len(flood.statuses) + others
    lines = _log(broker, "auth_failed")
    assert len(lines) == 10  # one per failed login up to the rate: the flood's first ten
    assert all("source=127.0.0.2:" in line for line in lines)
    assert "locked=source " in f"{lines[4]} "  # the guesser's address, after 5 failures
    (summary,) = _log(broker, "auth_failed_summary")  # then one line for the interval
    assert f"suppressed={failed - 10} " in f"{summary} "


async def _alice_moves_during_a_flood(broker: BrokerProcess, opened: list[Device]) -> Guesser:
    """Random usernames from 127.0.0.2 while alice registers from 127.0.0.3 eight times:
    she gets in every time."""
    guesser = Guesser("127.0.0.2", broker.sip_addr)
    await guesser.challenge()
    alice = await Device.open("alice", "127.0.0.3")
    opened.append(alice)
    stop = asyncio.Event()
    flood = asyncio.create_task(guesser.flood(stop))
    try:
        for _ in range(8):  # eight moves, each REGISTER answered while guesses run
            await _register(alice, broker)
    finally:
        stop.set()
        await flood
    assert len(guesser.statuses) > 10 and set(guesser.statuses) == {401}
    return guesser


async def _locks_hold(broker: BrokerProcess, opened: list[Device]) -> int:
    """Bob locked from 127.0.0.4; new ports of that address, then 20 more addresses
    (5 x max_keys) each with a wrong guess: every lock holds. The failed logins."""

    async def device(user: str, host: str) -> Device:
        opened.append(await Device.open(user, host))
        return opened[-1]

    guesser = Guesser("127.0.0.4", broker.sip_addr)
    await guesser.challenge()
    assert await guesser.guess(*["bob"] * 5) == [401] * 5  # bob and 127.0.0.4 locked
    # A new port of the locked address: even alice's right password is not checked.
    await _refused(_register(await device("alice", "127.0.0.4"), broker))
    for i in range(20):
        flooder = Guesser(f"127.0.0.{10 + i}", broker.sip_addr, guesser.nonce)
        assert await flooder.guess(secrets.token_hex(6)) == [401]
    # The locks hold: the address on a new port, bob from an address that failed.
    await _refused(_register(await device("alice", "127.0.0.4"), broker))
    await _refused(_register(await device("bob", "127.0.0.4"), broker))
    await _refused(_register(await device("bob", "127.0.0.29"), broker))
    # Bob himself, from an address that never failed, gets in.
    await _register(await device("bob", "127.0.0.40"), broker)
    return 5 + 1 + 20 + 3


async def test_a_move_whose_register_is_refused_exits_non_zero(tmp_path: Path) -> None:
    """``mdeci move`` to an address whose logins are locked: the REGISTER there is
    refused, and the command says so and exits 2 (the agent is bound there, retrying)."""
    broker = await BrokerProcess(tmp_path / "broker").start()
    alice = AgentProcess(tmp_path / "alice", "alice", "127.0.0.3", broker)
    try:
        await alice.start()
        await alice.wait_connected()
        guesser = Guesser("127.0.0.5", broker.sip_addr)
        await guesser.challenge()
        assert await guesser.guess(*["alice"] * 5) == [401] * 5  # alice and .5 locked
        code, out, err = await alice.cli("move", "127.0.0.5")
        assert code == 2, out + err
        assert "moved to 127.0.0.5:" in err and "REGISTER after move failed" in err, err
        assert "moved to" not in out
        status = await alice.status()
        assert status["status"] == "DISCONNECTED" and status["sip_addr"].startswith("127.0.0.5:")
    finally:
        await alice.stop()
        assert await broker.stop() == 0
