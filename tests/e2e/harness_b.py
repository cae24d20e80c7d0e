"""Helpers of the end-to-end tests of crash, TTL, auth and bad input.

- :class:`BrokerProcess` / :class:`AgentProcess`: ``python -m mdeci broker|agent`` as
  children of the test, started from a TOML file written here, with the readiness line
  awaited; ``kill9`` is a real ``SIGKILL`` of that one PID.
- :class:`TailCollector`: what an application reading the agent's ``tail`` gets, across
  agent restarts (it reconnects and asks for the kept ones after the last it saw).
- :class:`Device`: a SIP UA and a RUDP endpoint keyed by the session key of its own
  INVITE, to speak frames to a broker directly.
- :func:`snapshot`: every broker table's rows, to show that nothing was stored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import sqlalchemy as sa
from sqlalchemy.engine import Engine

from mdeci.agent.api import ApiClient
from mdeci.agent.errors import ApiError
from mdeci.broker.app import RunningBroker
from mdeci.config import load_agent_config, load_broker_config
from mdeci.frames import Frame, decode, encode
from mdeci.store.base import make_engine
from mdeci.store.migrate import upgrade
from mdeci.store.repo import BrokerStore
from rudp.aio import RudpEndpoint, RudpPeer
from rudp.config import RudpConfig
from sip.aio.ua import UaConfig, UserAgent
from sip.dialog import Dialog
from sip.message import Response
from sip.sdp import build_offer, parse_session
from sip.transaction import TimerConfig
from tests.keyx import OfferKeys
from tests.store.conftest import BROKER_TABLES

ROOT = Path(__file__).resolve().parents[2]
DOMAIN = "localhost"
BROKER_AOR = f"sip:broker@{DOMAIN}"
PASSWORDS = {"alice": "alice-secret", "bob": "bob-secret", "carol": "carol-secret"}
# Guards only: a cold child process imports everything and migrates a fresh database on a
# machine shared with other test runs.
START_GUARD = 60.0
GUARD = 30.0
# Loopback timers: a dead peer is noticed within ~2 s (keepalive + retries), but not so
# tight that a loaded machine sees false failures often (they would be recovered anyway).
RUDP = RudpConfig(
    rto_initial=0.2,
    rto_min=0.05,
    rto_max=0.4,
    max_retries=4,
    ack_delay=0.005,
    keepalive_interval=0.5,
)
TIMERS = TimerConfig(t1=0.05, t2=0.4, t4=0.5)

_RUDP_TOML = """\
[rudp]
rto_initial = 0.2
rto_min = 0.05
rto_max = 0.4
max_retries = 4
ack_delay = 0.005
keepalive_interval = 0.5
"""


def uri(user: str) -> str:
    return f"sip:{user}@{DOMAIN}"


def _hostport(text: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    return host.strip("[]"), int(port)


async def eventually(predicate: Callable[[], Awaitable[bool]], guard: float = GUARD) -> None:
    """Return once ``predicate()`` holds. Only for a child process's state, which has no
    event to await: the check is repeated (every 50 ms) until it holds or ``guard`` ends."""

    async def loop() -> None:
        while not await predicate():
            await asyncio.sleep(0.05)

    await asyncio.wait_for(loop(), guard)


# ---------------------------------------------------------------------------- storage


def pg_schema_url(base: str) -> tuple[str, str]:
    """A fresh schema on the PostgreSQL at ``base``: (its name, a URL that uses it)."""
    schema = f"e2e_{uuid.uuid4().hex[:12]}"
    admin = make_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    finally:
        admin.dispose()
    sep = "&" if "?" in base else "?"
    return schema, f"{base}{sep}options=-csearch_path%3D{schema}"


def drop_pg_schema(base: str, schema: str) -> None:
    admin = make_engine(base)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    finally:
        admin.dispose()


def sqlite_store(folder: Path) -> BrokerStore:
    """A BrokerStore on a new SQLite file in ``folder``, migrated to the Alembic head.
    Dispose of its engine at the end."""
    folder.mkdir(parents=True, exist_ok=True)
    url = f"sqlite:///{folder / 'broker.db'}"
    upgrade(url)
    return BrokerStore(make_engine(url))


def snapshot(engine: Engine) -> dict[str, list[tuple[Any, ...]]]:
    """Every row of every broker table, sorted: equal snapshots mean nothing was stored."""
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as conn:
        for table in BROKER_TABLES:
            rows = conn.execute(sa.text(f"SELECT * FROM {table}")).all()
            out[table] = sorted((tuple(r) for r in rows), key=repr)
    return out


def count_rows(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(sa.text(f"SELECT COUNT(*) FROM {table}")).scalar_one())


# ---------------------------------------------------------------------------- processes


class _Child:
    """One child process of ours; killed by its PID only."""

    def __init__(self) -> None:
        self.proc: asyncio.subprocess.Process | None = None
        self.stderr = b""

    async def _spawn(self, *args: str) -> str:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mdeci", *args,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), START_GUARD)
        if not line:
            await self._reap()
            raise AssertionError(f"mdeci {args[0]} did not start: {self.stderr.decode()}")
        return line.decode()

    async def _reap(self) -> int:
        assert self.proc is not None
        _out, err = await asyncio.wait_for(self.proc.communicate(), GUARD)
        self.stderr += err
        code = self.proc.returncode
        assert code is not None
        return code

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.returncode is None

    async def kill9(self) -> None:
        """``kill -9``: no shutdown code runs (no BYE, no flush, no unREGISTER)."""
        assert self.proc is not None and self.proc.returncode is None
        os.kill(self.proc.pid, signal.SIGKILL)
        assert await self._reap() == -signal.SIGKILL

    async def stop(self) -> int:
        """SIGTERM (a clean shutdown); the exit status."""
        if not self.running:
            return 0
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        try:
            return await self._reap()
        except TimeoutError:
            self.proc.kill()
            return await self._reap()


class BrokerProcess(_Child):
    """``python -m mdeci broker`` on loopback ``host`` with users alice, bob and carol; ``sip``:
    more lines of its ``[sip]`` table (e.g. transports and TLS files); ``extra``: more
    tables at the end of the file; ``node``: its name (several brokers on one store);
    ``transports``: its ``[media] transports``."""

    def __init__(
        self,
        folder: Path,
        store_url: str | None = None,
        sip: str = "",
        extra: str = "",
        *,
        host: str = "127.0.0.1",
        node: str = "broker-e2e",
        transports: tuple[str, ...] = ("rudp",),
    ) -> None:
        super().__init__()
        folder.mkdir(parents=True, exist_ok=True)
        self.config = folder / "broker.toml"
        store = "" if store_url is None else f'[store]\nurl = "{store_url}"\n\n'
        self.config.write_text(
            f'node = "{node}"\ndomain = "{DOMAIN}"\ndata_dir = "data"\n\n'
            f'[sip]\nhost = "{host}"\nt1 = 0.05\nt2 = 0.4\nt4 = 0.5\n{sip}\n'
            f"{_RUDP_TOML}\n{store}"
            + "".join(
                f'[[auth.users]]\nuser = "{u}"\npassword = "{p}"\n\n' for u, p in PASSWORDS.items()
            )
            + "[media]\ntransports = ["
            + ", ".join(f'"{t}"' for t in transports)
            + "]\n\n"
            + extra
        )
        self.loaded = load_broker_config(self.config)  # a bad file fails here, not in the child
        self.sip_addr: tuple[str, int] = (host, 0)
        self.media_addr: tuple[str, int] = (host, 0)
        self.tls_addr: tuple[str, int] | None = None

    async def start(self) -> BrokerProcess:
        """Start (again, on the same ports once they are known) and await the ready line."""
        line = await self._spawn(
            "broker", "--config", str(self.config),
            "--listen-sip", f"{self.sip_addr[0]}:{self.sip_addr[1]}",
            "--listen-media", f"{self.media_addr[0]}:{self.media_addr[1]}",
        )  # fmt: skip
        words = line.split()
        assert words[:2] == ["broker", "listening"], line
        self.sip_addr = _hostport(words[2].removeprefix("sip="))
        self.media_addr = _hostport(words[3].removeprefix("media="))
        for word in words[4:]:
            if word.startswith("tls="):
                self.tls_addr = _hostport(word.removeprefix("tls="))
        return self

    async def admin(self, *args: str) -> tuple[int, str, str]:
        """``python -m mdeci admin <args> --config <this broker's file>``."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mdeci", "admin", *args, "--config", str(self.config),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), START_GUARD)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


# An agent's SIP timers (lines of its [sip] table) and its [rudp] and [reconnect]
# tables, for loopback.
FAST_AGENT_TIMERS = (
    "t1 = 0.05\nt2 = 0.4\nt4 = 0.5\n",
    f"{_RUDP_TOML}\n[reconnect]\nbase = 0.05\nmax = 0.5\njitter = 0.2\n",
)


class AgentProcess(_Child):
    """``python -m mdeci agent`` of ``user`` bound to ``host``, talking to ``broker``
    (its SIP address, or ``address`` when given: a TLS port, a proxy); ``sip``: more
    lines of its ``[sip]`` table (transports, TLS files); ``timers``: its SIP timers
    and its ``[rudp]`` and ``[reconnect]`` tables instead of the fast loopback ones;
    ``transport``: its ``[media] transport``."""

    def __init__(
        self,
        folder: Path,
        user: str,
        host: str,
        broker: BrokerProcess,
        password: str | None = None,
        *,
        address: tuple[str, int] | None = None,
        sip: str = "",
        timers: tuple[str, str] = FAST_AGENT_TIMERS,
        transport: str = "rudp",
    ) -> None:
        super().__init__()
        folder.mkdir(parents=True, exist_ok=True)
        self.user = user
        self.config = folder / "agent.toml"
        where = address or ("127.0.0.1", broker.sip_addr[1])
        password = password or PASSWORDS[user]
        self.config.write_text(
            f'node = "{user}-e2e"\naor = "{uri(user)}"\n'
            f'password = "{password}"\nstate_dir = "state"\n\n'
            f'[registrar]\naddress = "{where[0]}:{where[1]}"\n\n'
            f'[broker]\naor = "{BROKER_AOR}"\naddress = "{where[0]}:{where[1]}"\n\n'
            f'[sip]\nhost = "{host}"\n{timers[0]}{sip}\n'
            f'[media]\nhost = "{host}"\ntransport = "{transport}"\n\n{timers[1]}\n\n'
            # Nothing moves in these tests: the monitor is as good as off.
            '[ip_monitor]\nmode = "poll"\npoll_interval = 600.0\n'
        )
        loaded = load_agent_config(self.config)
        self.state_dir = loaded.state_dir
        self.socket = loaded.api_socket
        self.churn_log = loaded.churnlog.path

    async def start(self) -> AgentProcess:
        line = await self._spawn("agent", "--config", str(self.config))
        assert line.startswith(f"agent {uri(self.user)} api="), line
        return self

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        async with ApiClient(self.socket) as client:
            return await asyncio.wait_for(client.call(request), GUARD)

    async def status(self) -> dict[str, Any]:
        status: dict[str, Any] = (await self.call({"op": "status"}))["status"]
        return status

    async def wait_connected(self) -> None:
        async def connected() -> bool:
            return bool((await self.status())["status"] == "CONNECTED")

        await eventually(connected)

    async def publish(self, subject: str, text: str, **attrs: Any) -> dict[str, Any]:
        return await self.call({"op": "pub", "subject": subject, "attrs": attrs, "text": text})

    def churn(self) -> list[dict[str, Any]]:
        """The records of its churn log so far (JSON lines)."""
        if not self.churn_log.exists():
            return []
        lines = self.churn_log.read_text().splitlines()
        return [json.loads(line) for line in lines if line]

    async def move(self, host: str) -> None:
        """``mdeci move HOST``, as an operator (or a network script) runs it."""
        code, out, err = await self.cli("move", host)
        assert code == 0, out + err

    async def subscribe(
        self, subject: str, filter: str = "", ttl: int | None = None, *, lease: bool = True
    ) -> str:
        request = {"op": "sub", "subject": subject, "filter": filter, "ttl": ttl, "lease": lease}
        answer = await self.call(request)
        return str(answer["sub_id"])

    async def cli(self, *args: str) -> tuple[int, str, str]:
        """``python -m mdeci <args> --config <this agent's file>``: (status, out, err)."""
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mdeci", *args, "--config", str(self.config),
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        )  # fmt: skip
        out, err = await asyncio.wait_for(proc.communicate(), START_GUARD)
        assert proc.returncode is not None
        return proc.returncode, out.decode(), err.decode()


class ApiPublisher:
    """bob (an `mdeci agent` process) publishing ``t<i>`` at ``rate`` per second through
    its local API, one request at a time on one connection: the broker gets them in the
    order sent, so alice's order can be checked. It stops by itself after ``limit``."""

    def __init__(self, agent: AgentProcess, subject: str, rate: float, limit: int = 5000) -> None:
        self.agent = agent
        self.limit = limit
        self.subject = subject
        self.interval = 1.0 / rate
        self.sent = 0
        self.elapsed = 0.0
        self.latencies: list[float] = []  # seconds each `pub` call took (its answer)
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> ApiPublisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        start = loop.time()
        async with ApiClient(self.agent.socket) as client:
            while not self._stop.is_set() and self.sent < self.limit:
                delay = start + self.sent * self.interval - loop.time()
                if delay > 0:  # pacing (the offered load), not synchronisation
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._stop.wait(), delay)
                    if self._stop.is_set():
                        break
                request = {
                    "op": "pub", "subject": self.subject, "attrs": {"i": self.sent},
                    "text": f"t{self.sent}",
                }  # fmt: skip
                began = loop.time()
                await asyncio.wait_for(client.call(request), GUARD)
                self.latencies.append(loop.time() - began)
                self.sent += 1
        self.elapsed = loop.time() - start

    async def stop(self) -> int:
        self._stop.set()
        if self._task is not None:
            await asyncio.wait_for(self._task, GUARD)
        return self.sent


def at_least(n: int) -> Callable[[list[dict[str, Any]]], bool]:
    """A :meth:`TailCollector.wait_for` condition: ``n`` notifications or more."""
    return lambda records: len(records) >= n


@dataclass(eq=False)
class TailCollector:
    """Everything the agent's ``tail`` hands an application, across agent restarts.

    After a lost connection it reconnects (when the agent is back) with
    ``from = last nseq seen + 1``: the kept notifications it missed, then live ones.
    """

    socket: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    arrivals: list[float] = field(default_factory=list)  # loop time each record came
    _changed: asyncio.Event = field(default_factory=asyncio.Event)
    _task: asyncio.Task[None] | None = None

    def start(self) -> TailCollector:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        while True:
            last = max((int(r["nseq"]) for r in self.records), default=0)
            try:
                async with ApiClient(self.socket) as client:
                    async for record in client.tail(last + 1):
                        self.records.append(record)
                        self.arrivals.append(asyncio.get_running_loop().time())
                        self._changed.set()
            except (ApiError, OSError, ValueError):
                pass
            # The agent is down (killed) or restarting: try again shortly.
            await asyncio.sleep(0.05)

    async def wait_for(self, predicate: Callable[[list[dict[str, Any]]], bool]) -> None:
        async def loop() -> None:
            while not predicate(self.records):
                self._changed.clear()
                await self._changed.wait()

        await asyncio.wait_for(loop(), GUARD)

    @property
    def texts(self) -> list[str]:
        return [str(r.get("text")) for r in self.records]

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)


# ---------------------------------------------------------------------------- raw device


@dataclass(eq=False)
class Device:
    """A device without the agent: our SIP UA (digest REGISTER/INVITE) and a RUDP
    endpoint whose peer is keyed by the session key of its own INVITE."""

    user: str
    ua: UserAgent
    rudp: RudpEndpoint
    keys: OfferKeys
    host: str
    key: bytes = b""  # the RUDP session secret, once the INVITE is answered
    dialog: Dialog | None = None
    peer: RudpPeer | None = None
    frames: asyncio.Queue[Frame] = field(default_factory=asyncio.Queue)
    _reader: asyncio.Task[None] | None = None

    @classmethod
    async def open(
        cls, user: str, host: str, *, password: str | None = None, aor: str | None = None
    ) -> Device:
        """``user`` authenticates with ``password`` (default: its own) as ``aor``
        (default: its own) in From."""
        ua = UserAgent(
            UaConfig(
                aor=aor or uri(user),
                username=user,
                password=PASSWORDS[user] if password is None else password,
                timers=TIMERS,
            )
        )
        await ua.start(host, 0)
        rudp = await RudpEndpoint.open(host, 0, config=RUDP)
        keys = OfferKeys(user, DOMAIN, PASSWORDS[user] if password is None else password)
        return cls(user, ua, rudp, keys, host)

    def offer(self) -> bytes:
        port = self.rudp.local_addr[1]
        return build_offer(self.user, 1, 1, self.host, port, self.keys.public).encode()

    async def call(self, broker: RunningBroker) -> Response:
        """INVITE the broker; the RUDP peer then speaks to its media address."""
        offer = self.offer()
        self.dialog, response = await asyncio.wait_for(
            self.ua.invite(BROKER_AOR, broker.sip_addr, offer), GUARD
        )
        media = parse_session(response.body)
        assert media.key is not None
        self.key = self.keys.secret(media.key, offer, response.body)
        self.attach((media.addr, media.port))
        return response

    def attach(self, media: tuple[str, int], key: bytes | None = None) -> RudpPeer:
        """Speak to ``media`` with ``key`` (default: our session's)."""
        self.peer = self.rudp.peer(key or self.key, media)
        self._reader = asyncio.create_task(self._read(self.peer))
        return self.peer

    async def _read(self, peer: RudpPeer) -> None:
        while True:
            self.frames.put_nowait(decode(await peer.receive()))

    async def send(self, data: Frame | bytes) -> None:
        assert self.peer is not None
        raw = data if isinstance(data, bytes) else encode(data)
        await asyncio.wait_for(self.peer.send(raw), GUARD)

    async def next(self) -> Frame:
        return await asyncio.wait_for(self.frames.get(), GUARD)

    async def ask(self, data: Frame | bytes) -> Frame:
        """Send, and the next frame that comes back."""
        await self.send(data)
        return await self.next()

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
            await asyncio.gather(self._reader, return_exceptions=True)
        await self.rudp.close()
        await self.ua.close()


@contextlib.asynccontextmanager
async def devices() -> AsyncIterator[list[Device]]:
    """Devices opened inside are closed at the end."""
    opened: list[Device] = []
    try:
        yield opened
    finally:
        for dev in opened:
            await dev.close()
