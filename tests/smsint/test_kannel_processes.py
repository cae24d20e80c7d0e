"""SMS fallback end to end with real processes: Kannel's bearerbox + smsbox
(+ fakesmsc from kannel-extras), ``mdeci broker`` and two ``mdeci agent`` processes
started from config files only; alice's IP is cut under her running agent.

The SMS network: fakesmsc is one phone for a whole fake SMSC and cannot answer, so the
numbers of alice and of the broker are routed to Kannel's ``smsc = loopback``, which
turns each MT it is given back into an MO (sender and receiver unchanged); smsbox hands
each MO to the ``sms-service`` of its receiver: one ``get-url`` is the broker's MO
listener, the other alice's agent's. Both send through smsbox's sendsms (alice with
``from`` = her MSISDN). fakesmsc stays connected as the SMSC of every other number.

Alice's agent runs in a network namespace of the test with two veths: ``data`` towards
the broker (cut with ``ip link set ... down``) and ``modem`` towards Kannel (her SMS
interface, never cut).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from mdeci.agent.api import ApiClient
from mdeci.store.base import make_engine
from mdeci.store.repo import BrokerStore
from tests.e2e.harness_a import (
    GUARD,
    STATUS_POLL,
    Child,
    Tail,
    agent_toml,
    is_connected,
    run_ip,
    spawn,
    start_agent,
    stop,
    wait_status,
)
from tests.peers import free_port, require_binary, require_netns
from tests.sms.kannel_harness import HOW, Ports, _stop, fakesmsc_binary, start_boxes

pytestmark = pytest.mark.peer("kannel")

BROKER_NO, ALICE_NO = "+15550000001", "+15550000002"
ALICE, BOB = "sip:alice@localhost", "sip:bob@localhost"
SENDSMS_PASSWORD = "test-pw"
ALICE_CALLBACK_PORT = 13081  # inside her namespace: nothing else listens there


# ------------------------------------------------------------------ Kannel


@dataclass(frozen=True)
class Routed:
    sendsms_url: str  # on the modem side of the host: the broker and alice both reach it
    broker_callback_port: int
    fakesmsc: subprocess.Popen[bytes]
    fakesmsc_out: Path


def routed_config(
    *, ports: dict[str, int], modem_host: str, alice_callback: str, workdir: Path
) -> str:
    """bearerbox + smsbox: MT to alice's and the broker's numbers loop back as MO, MT to
    any other number goes to fakesmsc; MO are routed by receiver to their listener."""
    service = (
        "group = sms-service\nkeyword = default\nname = {name}\n"
        'allowed-receiver-prefix = "{number}"\n'
        'get-url = "{url}?from=%p&to=%P&udh=%u&text=%b"\n'
        "max-messages = 0\ncatch-all = true\nomit-empty = true\n"
    )
    ours = f"{BROKER_NO};{ALICE_NO}"
    return f"""
group = core
admin-port = {ports["admin"]}
admin-password = mdeci-test
admin-interface = 127.0.0.1
smsbox-port = {ports["smsbox"]}
box-allow-ip = 127.0.0.1
# mdeci reassembles and acknowledges its own buffers (docs/sms.md).
sms-combine-concatenated-mo = false
log-file = "{workdir}/bearerbox.log"
log-level = 1

group = smsc
smsc = loopback
smsc-id = loop
allowed-prefix = "{ours}"

group = smsc
smsc = fake
smsc-id = fake
port = {ports["fake"]}
connect-allow-ip = 127.0.0.1
denied-prefix = "{ours}"

group = smsbox
bearerbox-host = 127.0.0.1
sendsms-port = {ports["sendsms"]}
sendsms-interface = {modem_host}
log-file = "{workdir}/smsbox.log"
log-level = 1

group = sendsms-user
username = mdeci
password = {SENDSMS_PASSWORD}
max-messages = 1

{service.format(name="broker", number=BROKER_NO,
                url=f"http://127.0.0.1:{ports['callback']}/kannel/mo")}
{service.format(name="alice", number=ALICE_NO, url=f"http://{alice_callback}/kannel/mo")}
"""  # fmt: skip


def _wait_fake_online(admin: int, deadline: float) -> None:
    """fakesmsc connects on its own schedule: wait until bearerbox shows it online."""
    url = f"http://127.0.0.1:{admin}/status.txt?password=mdeci-test"
    while True:
        with urllib.request.urlopen(url, timeout=2) as resp:
            text = resp.read().decode("utf-8", "replace")
        if any(line.strip().startswith("fake[") and "online" in line for line in text.splitlines()):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"fakesmsc did not come online:\n{text}")
        time.sleep(0.05)


@contextmanager
def running_routed_kannel(workdir: Path, modem_host: str, alice_callback: str) -> Iterator[Routed]:
    fakesmsc = fakesmsc_binary()

    def choose() -> Ports:
        ports = {k: free_port(socket.SOCK_STREAM) for k in ("admin", "smsbox", "fake", "callback")}
        ports["sendsms"] = free_port(socket.SOCK_STREAM, modem_host)
        return ports

    def render(ports: Ports) -> str:
        return routed_config(
            ports=ports, modem_host=modem_host, alice_callback=alice_callback, workdir=workdir
        )

    procs, ports = start_boxes(workdir, choose, render, sendsms_host=modem_host)
    deadline = time.monotonic() + 15
    try:
        # The SMSC of every other number: interactive (no MO of its own), its log kept.
        fake_out = workdir / "fakesmsc.out"
        with fake_out.open("wb") as out:
            phone = subprocess.Popen(
                [fakesmsc, "-H", "127.0.0.1", "-r", str(ports["fake"])],
                stdin=subprocess.PIPE,
                stdout=out,
                stderr=out,
            )
        procs.append(phone)
        _wait_fake_online(ports["admin"], deadline)
        yield Routed(
            sendsms_url=f"http://{modem_host}:{ports['sendsms']}/cgi-bin/sendsms",
            broker_callback_port=ports["callback"],
            fakesmsc=phone,
            fakesmsc_out=fake_out,
        )
    finally:
        for proc in reversed(procs):
            _stop(proc)


# ------------------------------------------------------------------ configs


CLASSES = """
[channels]
default_class = "normal"
urgent_class = "urgent"

[[channels.classes]]
name = "urgent"
wc = 0.1
we = 0.1
wl = 0.2
wv = 0.6
channels = ["ip", "sms"]

[[channels.classes]]
name = "normal"
channels = ["ip"]

[[channels.classes]]
name = "bulk"
wc = 1.0
we = 0.0
wl = 0.0
wv = 0.0
channels = ["ip", "sms"]
max_delay = 3600
"""


def broker_config(data_dir: Path, sendsms_url: str, callback_port: int) -> str:
    return f"""node = "broker-sms"
domain = "localhost"
data_dir = "{data_dir}"

[sip]
host = "127.0.0.1"
t1 = 0.05
t2 = 0.4
t4 = 0.5

[rudp]
rto_initial = 0.2
rto_min = 0.05
rto_max = 0.5
max_retries = 3
ack_delay = 0.002

[sms]
enabled = true
number = "{BROKER_NO}"
gateway = "kannel"
kannel_sendsms_url = "{sendsms_url}"
kannel_password = "{SENDSMS_PASSWORD}"
kannel_callback = "127.0.0.1:{callback_port}"
ttl = 600
ack_timeout = 10
{CLASSES}
[[auth.users]]
user = "alice"
password = "alice-secret"
msisdn = "{ALICE_NO}"

[[auth.users]]
user = "bob"
password = "bob-secret"
"""


def alice_config(
    state: Path, host: str, broker: tuple[str, int], sendsms_url: str, callback: str
) -> str:
    """Alice's agent: IP on the data veth, SMS through Kannel over the modem veth."""
    return (
        f'msisdn = "{ALICE_NO}"\n'
        + agent_toml(state, "alice", host, broker)
        + f"""
[sms]
enabled = true
broker_number = "{BROKER_NO}"
gateway = "kannel"
kannel_sendsms_url = "{sendsms_url}"
kannel_password = "{SENDSMS_PASSWORD}"
kannel_callback = "{callback}"
ack_timeout = 10
"""
    )


# ------------------------------------------------------------------ logs


def churn(path: Path) -> list[dict[str, Any]]:
    """The records of a churn log another process is writing (a line being written
    while we read, without its newline yet, is left for the next read)."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return [json.loads(line) for line in text.split("\n")[:-1] if line.strip()]


async def wait_churn(
    path: Path, predicate: Callable[[list[dict[str, Any]]], bool]
) -> list[dict[str, Any]]:
    """Read ``path`` (another process's churn log) again until ``predicate`` holds; like
    :func:`wait_status`, a file has no "tell me when" and GUARD bounds the polling."""

    async def go() -> list[dict[str, Any]]:
        while not predicate(records := churn(path)):
            await asyncio.sleep(STATUS_POLL)
        return records

    return await asyncio.wait_for(go(), GUARD)


def of(records: list[dict[str, Any]], event: str, **fields: Any) -> list[dict[str, Any]]:
    return [
        r for r in records if r["event"] == event and all(r.get(k) == v for k, v in fields.items())
    ]


# ------------------------------------------------------------------ the test


def _texts(records: list[dict[str, Any]]) -> dict[int, str]:
    return {int(r["nseq"]): str(r.get("text")) for r in records}


async def _call(sock: Path, request: dict[str, Any]) -> dict[str, Any]:
    async with ApiClient(sock) as client:
        answer: dict[str, Any] = await client.call(request)
    assert answer.get("ok") is True, answer
    return answer


async def test_ip_cut_urgent_by_sms_once_normal_waits_bulk_held_then_ip_drains(
    tmp_path: Path,
) -> None:
    require_netns()
    require_binary("bearerbox", HOW)
    tag = os.getpid() % 10000
    octet = 30 + os.getpid() % 200
    data, modem = f"10.79.{octet}", f"10.80.{octet}"
    ns = f"mdeci-sms-{tag}"
    data_h, data_n, modem_h, modem_n = (f"msd{tag}h", f"msd{tag}n", f"msm{tag}h", f"msm{tag}n")
    alice_ip, host_ip = f"{data}.2", f"{data}.1"
    callback = f"{modem}.2:{ALICE_CALLBACK_PORT}"
    children: list[Child] = []
    tails: list[Tail] = []
    try:
        run_ip("netns", "add", ns)
        for host_if, ns_if, net in ((data_h, data_n, data), (modem_h, modem_n, modem)):
            run_ip("link", "add", host_if, "type", "veth", "peer", "name", ns_if)
            run_ip("link", "set", ns_if, "netns", ns)
            run_ip("addr", "add", f"{net}.1/24", "dev", host_if)
            run_ip("link", "set", host_if, "up")
            run_ip("-n", ns, "addr", "add", f"{net}.2/24", "dev", ns_if)
            run_ip("-n", ns, "link", "set", ns_if, "up")
        run_ip("-n", ns, "link", "set", "lo", "up")

        with running_routed_kannel(tmp_path, f"{modem}.1", callback) as kannel:
            data_dir = tmp_path / "broker"
            (tmp_path / "broker.toml").write_text(
                broker_config(data_dir, kannel.sendsms_url, kannel.broker_callback_port)
            )
            broker = await spawn(
                "broker",
                ["broker", "--config", str(tmp_path / "broker.toml"),
                 "--listen-sip", f"{host_ip}:0", "--listen-media", f"{host_ip}:0"],
                tmp_path / "logs",
            )  # fmt: skip
            children.append(broker)
            sip_host, _, sip_port = broker.words["sip"].rpartition(":")
            sip = (sip_host, int(sip_port))
            alice, a_sock = await start_agent(
                tmp_path,
                "alice",
                alice_config(tmp_path / "alice", alice_ip, sip, kannel.sendsms_url, callback),
                prefix=("ip", "netns", "exec", ns),
            )
            children.append(alice)
            bob, b_sock = await start_agent(
                tmp_path, "bob", agent_toml(tmp_path / "bob", "bob", host_ip, sip)
            )
            children.append(bob)
            await wait_status(a_sock, is_connected)
            await wait_status(b_sock, is_connected)
            for subject, qclass in (("alerts.*", "urgent"), ("news.*", ""), ("digest.*", "bulk")):
                await _call(a_sock, {"op": "sub", "subject": subject, "qclass": qclass})
            await _call(b_sock, {"op": "sub", "subject": "replies.*"})
            # Her calendar: IP is there with probability 0.9 at any hour, so a bulk
            # notification waits 0.9 x 3600 s for it rather than paying for SMS.
            got = await _call(a_sock, {"op": "calendar", "rules": [{"channel": "ip", "p": 0.9}]})
            assert got["rules"] == 1
            app = await Tail(a_sock).start()
            tails.append(app)
            bob_app = await Tail(b_sock).start()
            tails.append(bob_app)
            broker_log, alice_log = data_dir / "broker-churn.log", tmp_path / "alice" / "churn.log"

            async def publish(subject: str, text: str, urgent: bool = False) -> None:
                await _call(b_sock, {"op": "pub", "subject": subject, "text": text,
                                     "urgent": urgent})  # fmt: skip

            # ---- IP cut: the data veth goes down inside her namespace; the modem stays.
            run_ip("-n", ns, "link", "set", data_n, "down")
            await publish("alerts.fire", "u1")
            await wait_churn(broker_log, lambda r: bool(of(r, "media_disconnected", uri=ALICE)))
            await asyncio.wait_for(app.wait_count(1), GUARD)  # by SMS, IP is down
            for subject, text in (("news.daily", "n1"), ("digest.weekly", "b1"),
                                  ("alerts.smoke", "u2"), ("news.daily", "n2"),
                                  ("digest.weekly", "b2")):  # fmt: skip
                await publish(subject, text)
            urgent, normal, bulk = (1, 4), (2, 5), (3, 6)
            await asyncio.wait_for(app.wait_count(2), GUARD)
            # Her acks come back by SMS: the broker deletes exactly those rows.
            log = await wait_churn(
                broker_log,
                lambda r: (
                    len(of(r, "notify_delivered", uri=ALICE, channel="sms")) == 2
                    and all(
                        of(r, "notify_queued", uri=ALICE, nseq=n, channel="sms")
                        for n in normal + bulk
                    )
                ),
            )
            assert _texts(app.records) == {1: "u1", 4: "u2"}
            assert sorted(r["nseq"] for r in of(log, "sms_sent", uri=ALICE)) == [1, 4]
            for n in normal:
                (q,) = of(log, "notify_queued", uri=ALICE, nseq=n, channel="sms")
                assert str(q["reason"]).startswith("sms not used"), q
            for n in bulk:
                (q,) = of(log, "notify_queued", uri=ALICE, nseq=n, channel="sms")
                assert str(q["reason"]).startswith("held until"), q
            engine = make_engine(f"sqlite:///{data_dir / 'broker.db'}")
            try:
                pending = BrokerStore(engine).queues.pending(ALICE)
                assert sorted(p.nseq for p in pending) == sorted(normal + bulk)
            finally:
                engine.dispose()
            mine = churn(alice_log)
            assert sorted(r["nseq"] for r in of(mine, "sms_received")) == [1, 4]
            assert sorted(r["nseq"] for r in of(mine, "notify_delivered", channel="sms")) == [
                1,
                4,
            ]

            # Her application answers: a normal publish finds IP down (it waits in her
            # outbox), then an urgent one goes by SMS at once.
            await _call(a_sock, {"op": "pub", "subject": "replies.seen", "text": "r1"})
            await wait_status(a_sock, lambda s: not is_connected(s))
            done = await _call(
                a_sock, {"op": "pub", "subject": "replies.ok", "text": "r2", "urgent": True}
            )
            assert done["state"] == "buffered"
            (first,) = await asyncio.wait_for(bob_app.wait_count(1), GUARD)
            assert first["text"] == "r2"  # by SMS: r1 still waits for her IP
            log = churn(broker_log)
            assert [r["reason"] for r in of(log, "sms_received", uri=ALICE)].count("op=pub") == 1

            # ---- IP returns: the rest drain over IP, nothing twice at her application.
            run_ip("-n", ns, "link", "set", data_n, "up")
            await wait_status(a_sock, is_connected)
            records = await asyncio.wait_for(app.wait_count(6), GUARD)
            assert _texts(records) == {1: "u1", 2: "n1", 3: "b1", 4: "u2", 5: "n2", 6: "b2"}
            assert len(records) == 6
            log = await wait_churn(
                broker_log,
                lambda r: (
                    {x["nseq"] for x in of(r, "notify_delivered", uri=ALICE)} == {1, 2, 3, 4, 5, 6}
                ),
            )
            delivered = of(log, "notify_delivered", uri=ALICE)
            by_ip = {r["nseq"] for r in delivered if r.get("channel") != "sms"}
            # Normal and bulk over IP; an urgent one in RUDP flight at the cut may be sent
            # again over IP (her gate refuses it and acks it) but is delivered only once.
            assert by_ip == set(normal + bulk)
            assert len(delivered) == 6
            assert sorted(r["nseq"] for r in of(log, "sms_sent", uri=ALICE)) == list(urgent)
            status = await wait_status(a_sock, lambda s: s["buffered"] == 0)
            assert status["highest_nseq"] == 6
            # Both her publishes answered over IP (r2 again, same msg_id): bob has each once.
            bob_records = await asyncio.wait_for(bob_app.wait_count(2), GUARD)
            assert sorted(r["text"] for r in bob_records) == ["r1", "r2"]
            log = churn(broker_log)
            queued_bob = [r for r in of(log, "notify_queued", uri=BOB) if "channel" not in r]
            assert len(queued_bob) == 2, queued_bob
            mine = churn(alice_log)
            assert sorted(r["nseq"] for r in of(mine, "sms_received")) == list(urgent)
            engine = make_engine(f"sqlite:///{data_dir / 'broker.db'}")
            try:
                assert BrokerStore(engine).queues.pending(ALICE) == []
            finally:
                engine.dispose()
            # A fresh reader of her inbox: six, once each.
            again = await Tail(a_sock).start()
            tails.append(again)
            kept = await asyncio.wait_for(again.wait_count(6), GUARD)
            order = [int(r["nseq"]) for r in kept]
            assert order == [int(r["nseq"]) for r in records]  # in the order they came
            assert sorted(order) == [1, 2, 3, 4, 5, 6]
            # Every SMS went through the loopback route: the other SMSC saw none.
            assert kannel.fakesmsc.poll() is None
            assert "Got message" not in kannel.fakesmsc_out.read_text(errors="replace")
            print(
                "\nkannel e2e: 2 urgent by SMS, acked by SMS; 2 normal waited, 2 bulk held "
                "(calendar p=0.9); 4 drained over IP; alice's urgent publish by SMS; 0 dup"
            )
    finally:
        for tail in tails:
            await tail.close()
        for child in reversed(children):
            await stop(child)
        with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
            run_ip("netns", "del", ns)
        for host_if in (data_h, modem_h):
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                run_ip("link", "del", host_if)  # normally gone with the namespace
