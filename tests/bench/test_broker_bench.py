"""Benchmark of the broker: end-to-end fan-out, queue drain and RSS, against
Mosquitto (QoS 1, persistent sessions) on the same machine in the same run.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_broker_bench.py``; the last test
prints every figure and the mdeci/Mosquitto ratios. Figures go to docs/benchmarks.md.

- The broker is a child process (``python -m mdeci broker``), so its RSS and CPU are its
  own. The agents are lightweight and in this process: per agent a real
  :class:`sip.aio.ua.UserAgent` (digest REGISTER + INVITE with ``build_offer``) and a
  real :class:`rudp.aio.RudpEndpoint` peer that acks each burst of notifies (what one
  loop iteration read) with one cumulative ``Ack`` frame, as ``mdeci.agent`` does
  (without its state files).
- Mosquitto is our own child (``mosquitto -c``, free port, ``max_queued_messages``
  raised past the drain size), subscribers and publisher are paho-mqtt clients in this
  process (one network thread each), QoS 1, ``clean_session=False``.
- Every wait is guarded by ``RUN_LIMIT``; every loop is bounded by its count.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from mdeci.frames import Ack, Frame, Notify, Pub, PubOk, Sub, SubOk, decode, encode
from mdeci.store.base import make_engine
from rudp.aio import RudpEndpoint, RudpPeer
from sip.aio.ua import UaConfig, UserAgent
from sip.dialog import Dialog
from sip.sdp import build_offer, parse_session
from tests.keyx import OfferKeys
from tests.peers import pg_url, require_binary

pytestmark = [pytest.mark.bench, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "bench.example"
BROKER = f"sip:broker@{DOMAIN}"
HOST = "127.0.0.1"
N_AGENTS = 100
# Each matched by all N_AGENTS: 5,000 notifications. BENCH_FAN_PUBS=n: n publishes (more
# notifications, so that broker CPU is measured over more than a few clock ticks).
FAN_PUBS = int(os.environ.get("BENCH_FAN_PUBS", "50"))
DRAIN = int(os.environ.get("BENCH_DRAIN", "10000"))
SESSIONS = 1_000
PAYLOAD = b"x" * 100
# Publishes in flight (no pub-ok / PUBACK yet), the same for both publishers.
PUB_WINDOW = int(os.environ.get("BENCH_PUB_WINDOW", "32"))
SETUP_CONCURRENCY = 20
RUN_LIMIT = 300.0  # seconds: a guard per workload, never a synchronisation
RESULTS: dict[str, float] = {}
PROFILE = (
    ["-m", "cProfile", "-o", os.environ["BENCH_PROFILE"]] if os.environ.get("BENCH_PROFILE") else []
)
# BENCH_UVLOOP=1: the broker child runs on uvloop's event loop (a measurement only: uvloop
# is not a dependency; docs/benchmarks.md has the figures).
UVLOOP = (
    [
        "-c",
        "import runpy, sys, uvloop; uvloop.install(); del sys.argv[1:3]; "
        "runpy.run_module('mdeci', run_name='__main__', alter_sys=True)",
    ]
    if os.environ.get("BENCH_UVLOOP")
    else []
)
# BENCH_WINDOW=n: the broker's delivery window (queue.window; default: the broker's own).
WINDOW = os.environ.get("BENCH_WINDOW", "")
# BENCH_PYSPY=prefix: py-spy samples the broker child during each timed phase (BrokerProc.spy).
PYSPY = os.environ.get("BENCH_PYSPY", "")


def password(user: str) -> str:
    return f"pw-{user}"


# ---------------------------------------------------------------------------- broker


def _proc_rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise AssertionError("no VmRSS")


def _proc_cpu_s(pid: int, stat: str = "stat") -> float:
    fields = Path(f"/proc/{pid}/{stat}").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class BrokerProc:
    """``python -m mdeci broker`` with a generated config, stopped by its own PID."""

    def __init__(
        self, proc: asyncio.subprocess.Process, sip: tuple[str, int], media_port: int = 0
    ) -> None:
        self.proc = proc
        self.sip = sip
        self.media_port = media_port
        self._spy: subprocess.Popen[bytes] | None = None

    async def spy(self, phase: str) -> None:
        """With BENCH_PYSPY=prefix, sample the broker child (every thread holding the GIL,
        i.e. its CPU, not its waits) from now to :meth:`unspy`, into
        ``prefix-<phase>.txt``; returns once py-spy says it samples. cProfile (BENCH_PROFILE)
        sees only the event loop's thread."""
        if not PYSPY:
            return
        self._spy = subprocess.Popen(
            [str(Path(sys.executable).parent / "py-spy"), "record", "--pid", str(self.pid),
             "--nonblocking", "--gil", "-r", "250", "-f", "raw", "--threads",
             "-o", f"{PYSPY}-{phase}.txt"],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert self._spy.stdout is not None
        line = await asyncio.to_thread(self._spy.stdout.readline)  # "Sampling process ..."
        assert b"Sampling" in line, line

    async def unspy(self) -> None:
        if self._spy is not None:  # our own child: SIGINT makes it write what it sampled
            self._spy.send_signal(signal.SIGINT)
            await asyncio.to_thread(self._spy.wait, 60)
            self._spy = None

    @classmethod
    async def start(
        cls,
        tmp: Path,
        store_url: str,
        users: list[str],
        *,
        root: Path | None = None,
        wrapper: list[str] | None = None,
        settings: list[str] | None = None,
        ports: tuple[int, int] = (0, 0),
        ready: float = 120.0,
    ) -> BrokerProc:
        """``root``: the source tree whose broker runs (default: this one); ``wrapper``:
        interpreter arguments before ``-m mdeci`` (default: the cProfile of BENCH_PROFILE);
        ``settings``: more TOML lines, before the users; ``ports``: SIP and media ports
        (0: any free one); ``ready``: seconds to wait for its "listening" line."""
        lines = [
            'node = "bench"',
            f'domain = "{DOMAIN}"',
            'data_dir = "data"',
            "[sip]",
            'transports = ["udp"]',
            "[store]",
            f'url = "{store_url}"',
            "[queue]",
            f"max_per_uri = {DRAIN * 2}",  # the drain must not overflow
            *([f"window = {WINDOW}"] if WINDOW else []),
            *(settings or []),
        ]
        for user in users:
            lines += ["[[auth.users]]", f'user = "{user}"', f'password = "{password(user)}"']
        config = tmp / "broker.toml"
        config.write_text("\n".join(lines) + "\n")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, *(PROFILE + UVLOOP if wrapper is None else wrapper),
            "-m", "mdeci", "broker", "--config", str(config),
            "--listen-sip", f"{HOST}:{ports[0]}", "--listen-media", f"{HOST}:{ports[1]}",
            cwd=ROOT if root is None else root, stdout=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert proc.stdout is not None
        line = (await asyncio.wait_for(proc.stdout.readline(), ready)).decode()
        words = line.split()
        assert words[:2] == ["broker", "listening"], line
        host, _, port = words[2].removeprefix("sip=").rpartition(":")
        media = int(words[3].removeprefix("media=").rpartition(":")[2])
        return cls(proc, (host, int(port)), media)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def rss_kb(self) -> int:
        return _proc_rss_kb(self.pid)

    def cpu_s(self) -> float:
        return _proc_cpu_s(self.pid)

    def loop_cpu_s(self) -> float:
        """CPU of the broker's event-loop thread alone (its main thread: tid = pid);
        the rest of :meth:`cpu_s` is the database thread's and the executors'."""
        return _proc_cpu_s(self.pid, f"task/{self.pid}/stat")

    async def stop(self) -> None:
        await self.unspy()
        if self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), 30)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


# ---------------------------------------------------------------------------- agents


class LightAgent:
    """A device reduced to its SIP UA and its RUDP peer; acks what it receives as
    ``mdeci.agent`` does: the messages its peer delivers in one loop iteration (its
    ``on_message`` callback) are taken as one burst once that iteration's reading is
    done (``call_soon``), and the burst's notifications are acked with ONE cumulative
    ``Ack(upto=highest)``; every frame is queued on the peer at once, its
    acknowledgement's future checked by a callback, no task per frame
    (``AgentAio._take_burst``, ``AgentAio._send`` and ``AgentCore.frames_received``, less
    the state files)."""

    def __init__(self, user: str, ua: UserAgent, rudp: RudpEndpoint, own_rudp: bool) -> None:
        self.user = user
        self.ua = ua
        self.rudp = rudp
        self.own_rudp = own_rudp
        self.key = b""  # the RUDP session secret of the current session
        self.version = 0
        self.dialog: Dialog | None = None
        self.peer: RudpPeer | None = None
        self.replies: asyncio.Queue[Frame] = asyncio.Queue()
        self.highest = 0
        self.target = 0  # notifications to wait for
        self.done = asyncio.Event()
        self.pub_oks = 0
        self.pub_room: asyncio.Semaphore | None = None
        self._burst: list[bytes] = []  # messages read in this loop iteration
        self._burst_soon = False
        self._sending: set[asyncio.Future[None]] = set()  # sent, not yet acknowledged

    @classmethod
    async def open(cls, user: str, rudp: RudpEndpoint | None = None) -> LightAgent:
        ua = UserAgent(UaConfig(aor=f"sip:{user}@{DOMAIN}", password=password(user), tcp=False))
        await ua.start(HOST, 0)
        own = rudp is None
        if rudp is None:
            rudp = await RudpEndpoint.open(HOST, 0)
        return cls(user, ua, rudp, own)

    async def connect(self, sip: tuple[str, int], *, register: bool, read: bool = True) -> None:
        if register:
            await self.ua.register(sip, 3600)
        self.version += 1
        keys = OfferKeys(self.user, DOMAIN, password(self.user))
        offer = build_offer(
            self.user, 1, self.version, HOST, self.rudp.local_addr[1], keys.public
        ).encode()
        self.dialog, response = await self.ua.invite(BROKER, sip, offer)
        media = parse_session(response.body)
        assert media.key is not None
        self.key = keys.secret(media.key, offer, response.body)
        peer = self.peer = self.rudp.peer(self.key, (media.addr, media.port))
        if read:
            peer.on_message = lambda data: self._on_message(peer, data)

    async def hang_up(self) -> None:
        """BYE (the broker marks the session ENDED); the next connect uses a new key."""
        assert self.dialog is not None
        await self.ua.bye(self.dialog)
        self.dialog = None
        self._stop_reader()
        self.rudp.remove_peer(self.key)
        self.peer = None
        self.key = b""

    def _stop_reader(self) -> None:
        if self.peer is not None:
            self.peer.on_message = None
        self._burst.clear()

    def _on_message(self, peer: RudpPeer, data: bytes) -> None:
        if peer is not self.peer:
            return
        self._burst.append(data)
        if not self._burst_soon:
            self._burst_soon = True
            asyncio.get_running_loop().call_soon(self._take_burst)

    def _take_burst(self) -> None:
        self._burst_soon = False
        burst, self._burst = self._burst, []
        peer = self.peer
        if peer is None or not burst:
            return
        upto = 0
        for data in burst:
            frame = decode(data)
            if isinstance(frame, Notify):
                upto = max(upto, frame.nseq)
            elif isinstance(frame, PubOk):
                self.pub_oks += 1
                if self.pub_room is not None:
                    self.pub_room.release()
            else:
                self.replies.put_nowait(frame)
        if upto:
            self.highest = max(self.highest, upto)
            self._send(peer, encode(Ack(upto=upto)), upto)  # one cumulative ack

    def _send(self, peer: RudpPeer, data: bytes, acked_upto: int = 0) -> None:
        future = peer.send_nowait(data)
        self._sending.add(future)
        future.add_done_callback(lambda done: self._sent(done, acked_upto))

    def _sent(self, future: asyncio.Future[None], acked_upto: int) -> None:
        self._sending.discard(future)
        # A failed send leaves a notification or pub-ok missing: RUN_LIMIT ends the run.
        ok = not future.cancelled() and future.exception() is None
        if ok and acked_upto >= self.target > 0:
            self.done.set()

    async def subscribe(self, subject: str) -> None:
        assert self.peer is not None
        await self.peer.send(encode(Sub(req=1, subject=subject)))
        reply = await self.replies.get()
        assert isinstance(reply, SubOk), reply

    def expect(self, upto_nseq: int) -> None:
        self.target = upto_nseq
        self.done.clear()
        if self.highest >= upto_nseq:
            self.done.set()

    async def publish(self, subject: str, count: int, prefix: str) -> None:
        """``count`` publishes, ``PUB_WINDOW`` at a time; returns once all are pub-ok."""
        assert self.peer is not None
        self.pub_room = asyncio.Semaphore(PUB_WINDOW)
        start = self.pub_oks
        for i in range(count):
            await self.pub_room.acquire()
            frame = Pub(req=i + 2, msg_id=f"{prefix}{i}", subject=subject, payload=PAYLOAD)
            self._send(self.peer, encode(frame))
        for _ in range(PUB_WINDOW):  # every slot back: every publish answered
            await self.pub_room.acquire()
        assert self.pub_oks - start == count

    async def close(self) -> None:
        self._stop_reader()
        if self.own_rudp:
            await self.rudp.close()
        await self.ua.close()


async def bounded_gather(items: list[Any], fn: Callable[[Any], Awaitable[Any]]) -> list[Any]:
    room = asyncio.Semaphore(SETUP_CONCURRENCY)

    async def one(item: Any) -> Any:
        async with room:
            return await fn(item)

    return list(await asyncio.gather(*(one(i) for i in items)))


# ---------------------------------------------------------------------------- stores


@pytest.fixture(scope="module")
def pg_schema_url() -> Iterator[str]:
    """A schema of our own in the shared test database, dropped at the end."""
    url = pg_url()
    schema = f"bench_{uuid.uuid4().hex[:12]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in url else "?"
    try:
        yield f"{url}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


def store_url(kind: str, request: pytest.FixtureRequest) -> str:
    if kind == "sqlite":
        return "sqlite:///broker.db"  # inside data_dir
    return str(request.getfixturevalue("pg_schema_url"))


# ---------------------------------------------------------------------------- mdeci


async def _mdeci_run(tmp: Path, url: str, label: str) -> None:
    agents_users = [f"a{i:03d}" for i in range(N_AGENTS)]
    broker = await BrokerProc.start(tmp, url, [*agents_users, "pub", "drain"])
    agents: list[LightAgent] = []
    try:
        # (a) fan-out: 100 connected agents, every publish matches all of them.
        agents = await bounded_gather(agents_users, LightAgent.open)
        await bounded_gather(agents, lambda a: a.connect(broker.sip, register=True))
        await bounded_gather(agents, lambda a: a.subscribe("bench.fan"))
        pub = await LightAgent.open("pub")
        agents.append(pub)
        await pub.connect(broker.sip, register=True)
        for a in agents[:N_AGENTS]:
            a.expect(FAN_PUBS)
        await broker.spy(f"{label}-fanout")
        cpu0, t0 = broker.cpu_s(), time.perf_counter()
        await asyncio.wait_for(pub.publish("bench.fan", FAN_PUBS, "f"), RUN_LIMIT)
        await asyncio.wait_for(
            asyncio.gather(*(a.done.wait() for a in agents[:N_AGENTS])), RUN_LIMIT
        )
        elapsed = time.perf_counter() - t0
        await broker.unspy()
        total = FAN_PUBS * N_AGENTS
        RESULTS[f"{label}.fan_rate"] = total / elapsed
        RESULTS[f"{label}.fan_cpu"] = (broker.cpu_s() - cpu0) / total * 10_000
        print(f"\n{label}: fan-out {total} notifications in {elapsed:.2f} s")

        # (b) drain: 10,000 queued while the session is ENDED, then a new INVITE.
        drain = await LightAgent.open("drain")
        agents.append(drain)
        await drain.connect(broker.sip, register=True)
        await drain.subscribe("bench.drain")
        await drain.hang_up()
        await broker.spy(f"{label}-publish")
        cpu0, own0, t_pub = broker.cpu_s(), time.process_time(), time.perf_counter()
        await asyncio.wait_for(pub.publish("bench.drain", DRAIN, "d"), RUN_LIMIT)
        RESULTS[f"{label}.pub_rate"] = DRAIN / (time.perf_counter() - t_pub)
        RESULTS[f"{label}.pub_cpu_us"] = (broker.cpu_s() - cpu0) / DRAIN * 1e6
        # The publisher's (this process's) CPU: with a window, each round trip waits for
        # both sides, so the client's CPU bounds the rate as much as the broker's.
        RESULTS[f"{label}.pub_client_us"] = (time.process_time() - own0) / DRAIN * 1e6
        await broker.unspy()
        drain.expect(DRAIN)
        await broker.spy(f"{label}-drain")
        cpu0, t0 = broker.cpu_s(), time.perf_counter()
        await drain.connect(broker.sip, register=False)
        await asyncio.wait_for(drain.done.wait(), RUN_LIMIT)
        RESULTS[f"{label}.drain_s"] = time.perf_counter() - t0
        RESULTS[f"{label}.drain_cpu"] = broker.cpu_s() - cpu0
        await broker.unspy()
        print(f"{label}: drain {DRAIN} in {RESULTS[f'{label}.drain_s']:.2f} s")
    finally:
        for a in agents:
            await a.close()
        await broker.stop()


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_mdeci_fanout_and_drain(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    await _mdeci_run(tmp_path, store_url(kind, request), f"mdeci-{kind}")


async def test_mdeci_rss_with_1000_sessions(tmp_path: Path) -> None:
    users = [f"a{i:04d}" for i in range(SESSIONS)]
    broker = await BrokerProc.start(tmp_path, "sqlite:///broker.db", users)
    shared = await RudpEndpoint.open(HOST, 0)  # one socket, one peer per session key
    agents: list[LightAgent] = []
    try:
        rss0 = broker.rss_kb()
        agents = await bounded_gather(users, lambda u: LightAgent.open(u, shared))
        t0 = time.perf_counter()
        await asyncio.wait_for(
            bounded_gather(agents, lambda a: a.connect(broker.sip, register=True, read=False)),
            RUN_LIMIT,
        )
        setup = time.perf_counter() - t0
        rss1 = broker.rss_kb()
        RESULTS["rss.before_kb"] = rss0
        RESULTS["rss.after_kb"] = rss1
        RESULTS["rss.setup_rate"] = SESSIONS / setup
        print(f"\nRSS {rss0} kB -> {rss1} kB with {SESSIONS} sessions ({setup:.1f} s to set up)")
    finally:
        for a in agents:
            await a.close()
        await shared.close()
        await broker.stop()


# ---------------------------------------------------------------------------- mosquitto


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, int]]:
    """Our own Mosquitto (port, pid); stopped by its PID."""
    binary = require_binary("mosquitto", "apt-get install mosquitto")
    tmp = tmp_path_factory.mktemp("mosquitto")
    port = _free_port()
    config = tmp / "mosquitto.conf"
    config.write_text(
        f"listener {port} {HOST}\nallow_anonymous true\n"
        f"max_queued_messages {DRAIN * 2}\n"  # default 1000 would drop most of the drain
        f"persistence true\npersistence_location {tmp}/\n"
        "log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\nlog_type information\n"
        "connection_messages false\n"
    )
    proc = subprocess.Popen([binary, "-c", str(config)], stderr=subprocess.PIPE, text=True, cwd=tmp)
    assert proc.stderr is not None
    try:
        for _ in range(50):  # bounded: its start-up lines, then "running"
            line = proc.stderr.readline()
            assert line, "mosquitto exited"
            if "running" in line:
                break
        threading.Thread(target=proc.stderr.read, daemon=True).start()  # keep the pipe empty
        yield port, proc.pid
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


class MqttSub:
    def __init__(self, port: int, client_id: str) -> None:
        import paho.mqtt.client as mqtt
        from paho.mqtt.enums import CallbackAPIVersion

        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            clean_session=False,
            protocol=mqtt.MQTTv311,
        )
        self.port = port
        self.count = 0
        self.target = 0
        self.done = threading.Event()
        self.connected = threading.Event()
        self.subscribed = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_connect = lambda *a: self.connected.set()
        self.client.on_subscribe = lambda *a: self.subscribed.set()

    def _on_message(self, _c: Any, _u: Any, _m: Any) -> None:
        self.count += 1
        if self.count >= self.target > 0:
            self.done.set()

    def start(self) -> None:
        self.client.connect(HOST, self.port, keepalive=60)
        self.client.loop_start()
        assert self.connected.wait(RUN_LIMIT)

    def subscribe(self, topic: str) -> None:
        self.client.subscribe(topic, qos=1)
        assert self.subscribed.wait(RUN_LIMIT)

    def expect(self, count: int) -> None:
        self.target = count
        if self.count >= count:
            self.done.set()

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _mqtt_publish(port: int, topic: str, count: int) -> None:
    """``count`` QoS 1 publishes with ``PUB_WINDOW`` in flight (no PUBACK yet), as the
    mdeci publisher has (``LightAgent.publish``): paho's own default is 20, which made
    the two publishers' windows differ."""
    pub = MqttSub(port, f"pub-{uuid.uuid4().hex[:6]}")
    pub.client.max_inflight_messages_set(PUB_WINDOW)
    pub.start()
    try:
        infos = [pub.client.publish(topic, PAYLOAD, qos=1) for _ in range(count)]
        for info in infos:
            info.wait_for_publish(RUN_LIMIT)  # PUBACK received
    finally:
        pub.stop()


def test_mosquitto_fanout_and_drain(mosquitto: tuple[int, int]) -> None:
    port, pid = mosquitto
    subs = [MqttSub(port, f"s{i:03d}") for i in range(N_AGENTS)]
    try:
        for s in subs:
            s.start()
            s.subscribe("bench/fan")
            s.expect(FAN_PUBS)
        cpu0, t0 = _proc_cpu_s(pid), time.perf_counter()
        _mqtt_publish(port, "bench/fan", FAN_PUBS)
        for s in subs:
            assert s.done.wait(RUN_LIMIT)
        elapsed = time.perf_counter() - t0
        total = FAN_PUBS * N_AGENTS
        RESULTS["mosquitto.fan_rate"] = total / elapsed
        RESULTS["mosquitto.fan_cpu"] = (_proc_cpu_s(pid) - cpu0) / total * 10_000
        print(f"\nmosquitto: fan-out {total} messages in {elapsed:.2f} s")
    finally:
        for s in subs:
            s.stop()

    drain = MqttSub(port, "drain")
    drain.start()
    drain.subscribe("bench/drain")
    drain.stop()  # offline; the persistent session queues for it
    cpu0, own0, t_pub = _proc_cpu_s(pid), time.process_time(), time.perf_counter()
    _mqtt_publish(port, "bench/drain", DRAIN)
    RESULTS["mosquitto.pub_rate"] = DRAIN / (time.perf_counter() - t_pub)
    RESULTS["mosquitto.pub_cpu_us"] = (_proc_cpu_s(pid) - cpu0) / DRAIN * 1e6
    RESULTS["mosquitto.pub_client_us"] = (time.process_time() - own0) / DRAIN * 1e6
    back = MqttSub(port, "drain")  # same client id, clean_session=False: the session resumes
    back.expect(DRAIN)
    cpu0, t0 = _proc_cpu_s(pid), time.perf_counter()
    back.start()
    try:
        assert back.done.wait(RUN_LIMIT), f"only {back.count} of {DRAIN} arrived"
        RESULTS["mosquitto.drain_s"] = time.perf_counter() - t0
        RESULTS["mosquitto.drain_cpu"] = _proc_cpu_s(pid) - cpu0
        print(f"mosquitto: drain {DRAIN} in {RESULTS['mosquitto.drain_s']:.2f} s")
    finally:
        back.stop()


# ---------------------------------------------------------------------------- report


def test_report() -> None:
    """Prints every figure of this run and the ratios (run the whole file)."""
    r = RESULTS
    print("\n\n| workload | system | figure | broker CPU |")
    print("|---|---|---|---|")
    for label in ("mdeci-sqlite", "mdeci-postgresql", "mosquitto"):
        if f"{label}.fan_rate" in r:
            print(
                f"| fan-out {FAN_PUBS}x{N_AGENTS} | {label} | "
                f"{r[f'{label}.fan_rate']:.0f} notifications/s | "
                f"{r[f'{label}.fan_cpu']:.2f} s / 10k ({r[f'{label}.fan_cpu'] * 100:.1f} µs each) |"
            )
    for label in ("mdeci-sqlite", "mdeci-postgresql", "mosquitto"):
        if f"{label}.drain_s" in r:
            print(
                f"| drain {DRAIN} | {label} | {r[f'{label}.drain_s']:.2f} s "
                f"({DRAIN / r[f'{label}.drain_s']:.0f}/s) | {r[f'{label}.drain_cpu']:.2f} s "
                f"({r[f'{label}.drain_cpu'] / DRAIN * 1e6:.1f} µs each) |"
            )
    for label in ("mdeci-sqlite", "mdeci-postgresql", "mosquitto"):
        if f"{label}.pub_rate" in r:
            cpu = r.get(f"{label}.pub_cpu_us")
            per = "" if cpu is None else f"{cpu:.0f} µs / publish"
            client = r.get(f"{label}.pub_client_us")
            if client is not None:
                per += f" (publisher: {client:.0f} µs)"
            rate = r[f"{label}.pub_rate"]
            print(f"| publish {DRAIN} (1 recipient) | {label} | {rate:.0f}/s | {per} |")
    if "rss.after_kb" in r:
        before, after = r["rss.before_kb"], r["rss.after_kb"]
        print(
            f"| RSS, {SESSIONS} sessions | mdeci-sqlite | {before / 1024:.1f} MB -> "
            f"{after / 1024:.1f} MB ({(after - before) / SESSIONS:.1f} kB/session; "
            f"set up at {r['rss.setup_rate']:.0f} sessions/s) | |"
        )
    print("\nratios mdeci / mosquitto (> 1: mdeci better):")
    if "mosquitto.fan_rate" in r:
        for label in ("mdeci-sqlite", "mdeci-postgresql"):
            if f"{label}.fan_rate" in r:
                ratio = r[f"{label}.fan_rate"] / r["mosquitto.fan_rate"]
                print(f"  fan-out rate {label}: {ratio:.3f}")
    if "mosquitto.pub_rate" in r:
        for label in ("mdeci-sqlite", "mdeci-postgresql"):
            if f"{label}.pub_rate" in r:
                ratio = r[f"{label}.pub_rate"] / r["mosquitto.pub_rate"]
                print(f"  publish rate {label}: {ratio:.3f}")
    if "mosquitto.drain_s" in r:
        for label in ("mdeci-sqlite", "mdeci-postgresql"):
            if f"{label}.drain_s" in r:
                ratio = r["mosquitto.drain_s"] / r[f"{label}.drain_s"]
                print(f"  drain speed {label}: {ratio:.3f}")
    assert r, "run the whole file: the report needs the other tests' figures"
