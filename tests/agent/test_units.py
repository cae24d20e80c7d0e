"""Unit tests of the agent's pure parts: state files, back-off, IP monitor."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import stat
from pathlib import Path

import pytest

from mdeci.agent.backend import MdeciSipBackend
from mdeci.agent.backoff import Backoff
from mdeci.agent.errors import AgentError
from mdeci.agent.events import Register
from mdeci.agent.ipmonitor import PollingIpMonitor, is_held, pick_new
from mdeci.agent.state import (
    Inbox,
    NseqState,
    Outbox,
    OutgoingPub,
    lock_state_dir,
    make_state_dir,
    open_state_files,
)
from mdeci.config import ReconnectConfig, load_agent_config
from tests.agent.farend import GUARD, agent_config
from tests.sip.certs import make_certs


def test_nseq_survives_restart_and_refuses_duplicates(tmp_path: Path) -> None:
    state = NseqState(tmp_path / "nseq.json")
    assert state.gate.accept(1) and state.gate.accept(2)
    state.save()
    again = NseqState(tmp_path / "nseq.json")
    assert again.highest == 2
    assert not again.gate.accept(2) and not again.gate.accept(1)
    assert again.gate.accept(3)
    assert not (tmp_path / "nseq.json.tmp").exists()  # written by rename


def test_nseq_takes_the_inbox_when_ahead(tmp_path: Path) -> None:
    # A crash after the inbox append and before the nseq file moved.
    inbox = Inbox(tmp_path / "inbox.jsonl")
    inbox.append({"nseq": 7, "subject": "a"})
    inbox.close()
    reopened = Inbox(tmp_path / "inbox.jsonl")
    state = NseqState(tmp_path / "nseq.json", floor=reopened.last_nseq)
    assert state.highest == 7 and not state.gate.accept(7)
    assert [r["nseq"] for r in reopened.since(0)] == [7]


def test_inbox_keeps_the_newest(tmp_path: Path) -> None:
    inbox = Inbox(tmp_path / "i.jsonl", keep=3)
    for n in range(1, 6):
        inbox.append({"nseq": n})
    inbox.close()
    assert [r["nseq"] for r in Inbox(tmp_path / "i.jsonl", keep=3).since(0)] == [3, 4, 5]


def test_outbox_survives_a_crash_and_a_torn_line(tmp_path: Path) -> None:
    path = tmp_path / "outbox.jsonl"
    box = Outbox(path)
    box.add(OutgoingPub(msg_id="a", subject="x.y", attrs={"n": 1}, payload=b"\x00\xff"))
    box.add(OutgoingPub(msg_id="b", subject="x.z", urgent=True))
    box.add(OutgoingPub(msg_id="c", subject="x.w"))
    box.done("b")
    # No close: a crash. Then a torn half line at the end.
    with open(path, "ab") as fh:
        fh.write(b'{"done":"a"')
    reopened = Outbox(path)
    assert [p.msg_id for p in reopened.pending()] == ["a", "c"]
    first = reopened.pending()[0]
    assert (dict(first.attrs), first.payload) == ({"n": 1}, b"\x00\xff")
    reopened.done("a")
    reopened.close()
    assert [p.msg_id for p in Outbox(path).pending()] == ["c"]
    # Reopening compacts: only the pending publish is left in the file.
    assert len(path.read_text().splitlines()) == 1


def test_state_files_are_0600_in_a_0700_folder_whatever_the_umask(tmp_path: Path) -> None:
    state = tmp_path / "state"
    old = os.umask(0)
    try:
        make_state_dir(state)
        lock = lock_state_dir(state)
        files = open_state_files(state)
        files.outbox.add(OutgoingPub(msg_id="a", subject="x.y"))
        files.nseq.save()  # nseq.json, through a temporary file
        files.subs.replace(())  # subs.json likewise
        files.inbox.append({"nseq": 1})
        files.inbox.archive("old")
        files.close()
        lock.close()
        # An existing folder and file left wider (an earlier version, a hand-made folder).
        os.chmod(state, 0o755)
        os.chmod(state / "outbox.jsonl", 0o644)
        make_state_dir(state)
        open_state_files(state).close()  # reopened, compacted (rewritten)
    finally:
        os.umask(old)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    modes = {path.name: stat.S_IMODE(path.stat().st_mode) for path in state.iterdir()}
    assert {"lock", "inbox.jsonl", "inbox.old.jsonl", "outbox.jsonl", "nseq.json"} <= set(modes)
    assert set(modes.values()) == {0o600}, modes


def test_backoff_schedule_with_fixed_random() -> None:
    cfg = ReconnectConfig(base=1.0, max=10.0, jitter=0.5)
    draws = iter([0.5, 0.0, 0.999999, 0.5, 0.5, 0.0])
    backoff = Backoff(cfg, lambda: next(draws))
    delays = [backoff.next_delay() for _ in range(6)]
    assert delays == pytest.approx([1.0, 1.0, 6.0, 8.0, 10.0, 5.0], abs=1e-4)
    backoff.reset()
    assert backoff.attempt == 0


def test_backoff_spreads_agents() -> None:
    cfg = ReconnectConfig(base=1.0, max=60.0, jitter=0.2)
    values = iter([0.0, 0.25, 0.5, 0.75])
    delays = {Backoff(cfg, lambda: next(values)).delay_for(3) for _ in range(4)}
    assert len(delays) == 4 and all(6.4 <= d <= 9.6 for d in delays)


def test_ip_monitor_follows_a_fake_source() -> None:
    addresses = [frozenset({"10.0.0.5/24"})]
    monitor = PollingIpMonitor(lambda: addresses[0], "10.0.0.5", 1.0)
    assert monitor.check() is None
    addresses[0] = frozenset({"10.0.1.7/24", "fe80::1/64"})
    assert monitor.check() == "10.0.1.7"
    assert monitor.host == "10.0.1.7"
    assert monitor.check() is None  # settled
    addresses[0] = frozenset()
    assert monitor.check() is None  # nothing to move to


def test_loopback_aliases_are_held_by_the_lo_network() -> None:
    lo = frozenset({"127.0.0.1/8", "::1/128"})
    assert is_held("127.0.0.2", lo)
    assert pick_new("127.0.0.3", lo) is None
    assert pick_new("192.168.1.4", frozenset({"192.168.2.9/24", "127.0.0.1/8"})) == "192.168.2.9"


def test_an_address_replaced_in_the_same_network_is_not_held() -> None:
    # `ip addr del 10.77.20.2/24; ip addr add 10.77.20.3/24`: .2 lies in .3's network but
    # is no longer local (only a loopback prefix makes its whole network local). Taking
    # it as held, the agent in the network namespace test never moved.
    assert not is_held("10.77.20.2", frozenset({"10.77.20.3/24"}))
    assert pick_new("10.77.20.2", frozenset({"10.77.20.3/24", "fe80::1/64"})) == "10.77.20.3"
    assert is_held("10.77.20.3", frozenset({"10.77.20.3/24"}))


@pytest.mark.parametrize(
    ("sip", "transport", "listens_tls"),
    [
        ("", "udp", False),
        ('transports = ["tcp"]\n', "tcp", False),
        ('transports = ["tls"]\ntls_ca = "certs/ca.pem"\n', "tls", False),
        ('transports = ["tls", "udp"]\ntls_ca = "certs/ca.pem"\n'
         'tls_cert = "certs/server.pem"\ntls_key = "certs/server.key"\n', "tls", True),
    ],
)  # fmt: skip
def test_backend_transport_comes_from_agent_toml(
    tmp_path: Path, sip: str, transport: str, listens_tls: bool
) -> None:
    """``[sip] transports``: the first is how the agent reaches registrar and broker; TLS
    verifies with ``tls_ca`` (resolved beside the file); a TLS listener only with a
    certificate, on any free port by default (the broker's 5061 is not the agent's)."""
    certs = make_certs(tmp_path / "certs")
    path = tmp_path / "agent.toml"
    path.write_text(f'aor = "sip:alice@localhost"\npassword = "pw"\n[sip]\n{sip}')
    config = load_agent_config(path, env={})
    backend = MdeciSipBackend(config, lambda n: bytes(n))
    ua = backend.ua.config
    assert backend.transport == transport
    assert ua.tcp == ("tcp" in config.sip.transports)
    assert ua.tls_ca == (str(certs.ca) if transport == "tls" else None)
    assert (ua.tls_cert is not None) == listens_tls
    assert ua.tls_port == 0


def test_unreadable_tls_ca_is_a_clear_error(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text(
        'aor = "sip:alice@localhost"\npassword = "pw"\n'
        '[sip]\ntransports = ["tls"]\ntls_ca = "missing.pem"\n'
    )
    with pytest.raises(AgentError, match=r"^\[sip\] tls_ca/tls_cert/tls_key: .*No such file"):
        MdeciSipBackend(load_agent_config(path, env={}), lambda n: bytes(n))


async def test_backend_keeps_its_stream_to_the_registrar_alive(tmp_path: Path) -> None:
    """Over TCP/TLS the agent pings its connection (CRLFCRLF, RFC 5626 §3.5.1) every
    ``keepalive`` seconds, so the flow the broker sends its BYE over does not idle out."""
    received: asyncio.Queue[bytes] = asyncio.Queue()

    async def registrar(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        received.put_nowait(await reader.readuntil(b"\r\n\r\n"))  # the REGISTER's head
        received.put_nowait(await reader.readexactly(4))
        writer.close()

    server = await asyncio.start_server(registrar, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    base = agent_config(tmp_path, "alice", "127.0.0.1", port)
    config = dataclasses.replace(base, sip=dataclasses.replace(base.sip, transports=("tcp",)))
    backend = MdeciSipBackend(config, lambda n: bytes(n), keepalive=0.05)
    await backend.start(lambda call_id: None)
    registering = asyncio.create_task(backend.execute(Register(600)))
    try:
        head = await asyncio.wait_for(received.get(), GUARD)
        assert head.startswith(b"REGISTER ") and b"SIP/2.0/TCP" in head
        assert await asyncio.wait_for(received.get(), GUARD) == b"\r\n\r\n"
    finally:
        registering.cancel()
        await backend.close()
        server.close()
