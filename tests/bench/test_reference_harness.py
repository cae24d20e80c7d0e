"""Mosquitto driven by its own C clients, next to the mdeci broker, in one run: the
broker process CPU per delivered message of both, and the harness's own CPU to show
that the clients are not what limits the reference's rates.

Run: ``.venv/bin/pytest -m bench -s tests/bench/test_reference_harness.py``; the last
test prints every figure and the mdeci/Mosquitto ratios. Figures go to
docs/benchmarks.md ("Mosquitto reference harness").

- Mosquitto is our own child (``mosquitto -c``, free port, the same settings as in
  ``test_broker_bench.py``); its log on stderr says which client ids have connected,
  which is how the test knows the clients are ready before a timed phase starts.
- Its clients are Debian's ``mosquitto_sub`` and ``mosquitto_pub`` (C, libmosquitto),
  one process per MQTT client, QoS 1, persistent sessions (``-c -i id``): a
  subscriber exits after its last message (``-C n``), the publisher sends one message
  per stdin line (``-l``) with ``PUB_WINDOW`` unacknowledged (``-M``) and exits after
  the last PUBACK.
- The harness's CPU is the clients' user + system time inside the timed phase
  (their rusage once reaped, less what they had used when the phase began) plus this
  process's own CPU over the phase.
- The mdeci side is ``test_broker_bench._mdeci_run`` unchanged: same sizes, same
  agents, same accounting of broker CPU.
- Every wait is guarded by ``RUN_LIMIT``; every loop is bounded by its count; every
  process is ours and stopped by its PID.
"""

from __future__ import annotations

import asyncio
import os
import re
import resource
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.bench import test_broker_bench as bench
from tests.peers import require_binary

pytestmark = [pytest.mark.bench, pytest.mark.timeout(900)]

# ``bench.store_url`` asks for this fixture by name.
pg_schema_url = bench.pg_schema_url

HOST = bench.HOST
N_SUBS = bench.N_AGENTS
FAN_PUBS = bench.FAN_PUBS
DRAIN = bench.DRAIN
RUN_LIMIT = bench.RUN_LIMIT
LINE = bench.PAYLOAD + b"\n"  # one message per line for ``mosquitto_pub -l``
CONNECTED = re.compile(r"New client connected from \S+ as (\S+) \(")
IDLE_WINDOW = 2.0  # seconds
RESULTS: dict[str, float] = {}
LOAD: list[str] = []


def _load() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def _cpu_s(pid: int) -> float:
    """CPU time of a live process, summed over its threads, in nanoseconds' resolution
    (``/proc/PID/task/*/schedstat``): ``/proc/PID/stat`` counts clock ticks (10 ms), too
    coarse for a phase in which a broker spends 0.05 s. A thread that ends within a
    phase takes its time with it; the brokers' threads live as long as they do."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except FileNotFoundError:  # the thread has just ended
            continue
    return total / 1e9


def _children_cpu_s() -> float:
    """User + system time of every child of this process reaped so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


class Mosquitto:
    """Our own ``mosquitto`` with a generated config on a free port; a thread reads its
    log and records every client id that connects."""

    def __init__(self, tmp: Path) -> None:
        binary = require_binary("mosquitto", "apt-get install mosquitto")
        self.port = bench._free_port()
        config = tmp / "mosquitto.conf"
        config.write_text(
            f"listener {self.port} {HOST}\nallow_anonymous true\n"
            f"max_queued_messages {DRAIN * 2}\n"  # default 1000 would drop most of the drain
            f"persistence true\npersistence_location {tmp}/\n"
            "log_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n"
            "log_type information\nconnection_messages true\n"
        )
        self.proc = subprocess.Popen(
            [binary, "-c", str(config)], stderr=subprocess.PIPE, text=True, cwd=tmp
        )
        self.connected: list[str] = []
        self._changed = threading.Condition()
        assert self.proc.stderr is not None
        try:
            for _ in range(50):  # bounded: its start-up lines, then "running"
                line = self.proc.stderr.readline()
                assert line, "mosquitto exited"
                if "running" in line:
                    break
        except BaseException:
            self.stop()
            raise
        threading.Thread(target=self._read_log, daemon=True).start()

    def _read_log(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:  # ends when mosquitto closes its stderr
            match = CONNECTED.search(line)
            if match:
                with self._changed:
                    self.connected.append(match[1])
                    self._changed.notify_all()

    def mark(self) -> int:
        """A point in the connection log, for :meth:`wait_connected`."""
        with self._changed:
            return len(self.connected)

    def wait_connected(self, ids: set[str], since: int) -> None:
        """Until every id in ``ids`` has connected after ``since``."""
        with self._changed:
            ok = self._changed.wait_for(lambda: ids <= set(self.connected[since:]), RUN_LIMIT)
        assert ok, f"not connected: {sorted(ids - set(self.connected[since:]))[:5]}"

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def mosquitto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Mosquitto]:
    broker = Mosquitto(tmp_path_factory.mktemp("mosquitto-ref"))
    try:
        yield broker
    finally:
        broker.stop()


class Clients:
    """The C client processes of one phase, each started and stopped by this object."""

    def __init__(self, broker: Mosquitto) -> None:
        self.broker = broker
        self.procs: list[subprocess.Popen[bytes]] = []
        self.sub = require_binary("mosquitto_sub", "apt-get install mosquitto-clients")
        self.pub = require_binary("mosquitto_pub", "apt-get install mosquitto-clients")

    def _common(self, client_id: str) -> list[str]:
        port = str(self.broker.port)
        return ["-h", HOST, "-p", port, "-V", "mqttv311", "-q", "1", "-i", client_id]

    def subscriber(self, client_id: str, topic: str, *extra: str) -> subprocess.Popen[bytes]:
        """``mosquitto_sub`` with a persistent session (``-c``); its output is dropped."""
        args = [self.sub, *self._common(client_id), "-c", "-t", topic, *extra]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL)
        self.procs.append(proc)
        return proc

    def publisher(self, client_id: str, topic: str) -> subprocess.Popen[bytes]:
        """``mosquitto_pub -l``: one message per stdin line, ``PUB_WINDOW`` in flight."""
        window = str(bench.PUB_WINDOW)
        args = [self.pub, *self._common(client_id), "-M", window, "-t", topic, "-l"]
        proc = subprocess.Popen(args, stdin=subprocess.PIPE)
        self.procs.append(proc)
        return proc

    def cpu_s(self) -> float:
        """CPU the running clients have used so far (read at a phase's start)."""
        return sum(_cpu_s(p.pid) for p in self.procs if p.poll() is None)

    def wait_all(self, deadline: float) -> None:
        for proc in self.procs:
            rc = proc.wait(max(0.1, deadline - time.monotonic()))
            assert rc == 0, f"client {proc.pid} exited with {rc}"

    def stop(self) -> None:
        for proc in self.procs:  # only ours, by their PIDs
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        self.procs.clear()


def _subscribe_and_leave(broker: Mosquitto, ids: list[str], topic: str) -> None:
    """Persistent sessions subscribed to ``topic``, then offline (``mosquitto_sub -E``)."""
    clients = Clients(broker)
    try:
        for client_id in ids:
            clients.subscriber(client_id, topic, "-E")
        clients.wait_all(time.monotonic() + RUN_LIMIT)
    finally:
        clients.stop()


class Phase:
    """One timed phase: broker CPU, the harness's CPU and the wall time from
    :meth:`begin` to :meth:`end`."""

    def __init__(self, broker: Mosquitto, clients: Clients) -> None:
        self.broker = broker
        self.clients = clients
        self.children0 = _children_cpu_s()  # before any of this phase's clients is reaped

    def begin(self) -> None:
        self.before = self.clients.cpu_s()
        self.own0 = time.process_time()
        self.cpu0 = self.broker.cpu_s()
        self.t0 = time.perf_counter()

    def end(self) -> tuple[float, float, float]:
        """(wall s, broker CPU s, harness CPU s); every client has exited."""
        elapsed = time.perf_counter() - self.t0
        broker = self.broker.cpu_s() - self.cpu0
        clients = _children_cpu_s() - self.children0 - self.before
        return elapsed, broker, clients + time.process_time() - self.own0


def _record(key: str, count: int, wall: float, broker: float, harness: float) -> None:
    RESULTS[f"{key}.rate"] = count / wall
    RESULTS[f"{key}.broker_us"] = broker / count * 1e6
    RESULTS[f"{key}.harness_us"] = harness / count * 1e6
    RESULTS[f"{key}.harness_cores"] = harness / wall
    RESULTS[f"{key}.harness_s"] = harness
    print(
        f"\nmosquitto {key}: {count} in {wall:.2f} s, broker {broker * 1e6 / count:.1f} µs "
        f"each, harness {harness:.2f} s CPU ({harness / wall:.2f} cores)"
    )


def _fan_out(broker: Mosquitto, ids: list[str], pubs: int, key: str) -> None:
    clients = Clients(broker)
    try:
        phase = Phase(broker, clients)
        since = broker.mark()
        for client_id in ids:
            clients.subscriber(client_id, "bench/fan", "-C", str(pubs))
        pub = clients.publisher(f"pub-{key}", "bench/fan")
        broker.wait_connected({*ids, f"pub-{key}"}, since)
        phase.begin()
        pub.communicate(LINE * pubs, RUN_LIMIT)
        clients.wait_all(time.monotonic() + RUN_LIMIT)
        _record(key, pubs * len(ids), *phase.end())
    finally:
        clients.stop()


def test_mosquitto_with_c_clients(mosquitto: Mosquitto) -> None:
    LOAD.append(f"mosquitto start {_load()}")
    ids = [f"s{i:03d}" for i in range(N_SUBS)]
    _subscribe_and_leave(mosquitto, ids, "bench/fan")
    _subscribe_and_leave(mosquitto, ["drain"], "bench/drain")

    # (a) fan-out: N_SUBS connected subscribers, FAN_PUBS publishes match all of them;
    # then the same with one publish: the harness's cost per process (start-up
    # handshake, exit), which does not grow with the messages.
    _fan_out(mosquitto, ids, FAN_PUBS, "fan")
    _fan_out(mosquitto, ids, 1, "fan1")

    # (b) publish DRAIN to the offline "drain" session, each PUBACKed.
    clients = Clients(mosquitto)
    try:
        phase = Phase(mosquitto, clients)
        since = mosquitto.mark()
        pub = clients.publisher("pub-drain", "bench/drain")
        mosquitto.wait_connected({"pub-drain"}, since)
        phase.begin()
        pub.communicate(LINE * DRAIN, RUN_LIMIT)
        clients.wait_all(time.monotonic() + RUN_LIMIT)
        _record("pub", DRAIN, *phase.end())
    finally:
        clients.stop()

    # (c) drain: the session returns and takes all DRAIN; the wall time includes the
    # client's start and CONNECT, as the mdeci drain includes its INVITE.
    clients = Clients(mosquitto)
    try:
        phase = Phase(mosquitto, clients)
        phase.begin()
        clients.subscriber("drain", "bench/drain", "-C", str(DRAIN))
        clients.wait_all(time.monotonic() + RUN_LIMIT)
        _record("drain", DRAIN, *phase.end())
    finally:
        clients.stop()
    LOAD.append(f"mosquitto end {_load()}")


@pytest.mark.parametrize("kind", ["sqlite", "postgresql"])
async def test_mdeci_same_cases(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The broker's CPU on the same clock as Mosquitto's.
    monkeypatch.setattr(bench, "_proc_cpu_s", _cpu_s)
    stop = bench.BrokerProc.stop

    async def idle_then_stop(broker: bench.BrokerProc) -> None:
        """The broker's CPU over IDLE_WINDOW once the run is over (its agents closed,
        their sessions still held): what a phase costs per second besides its messages."""
        cpu0, t0 = broker.cpu_s(), time.perf_counter()
        await asyncio.sleep(IDLE_WINDOW)  # a measurement window, not a wait for an event
        RESULTS[f"{kind}.idle_cores"] = (broker.cpu_s() - cpu0) / (time.perf_counter() - t0)
        await stop(broker)

    monkeypatch.setattr(bench.BrokerProc, "stop", idle_then_stop)
    label = f"ref-mdeci-{kind}"
    LOAD.append(f"{label} start {_load()}")
    await bench._mdeci_run(tmp_path, bench.store_url(kind, request), label)
    r = bench.RESULTS
    fan = FAN_PUBS * N_SUBS
    RESULTS[f"{kind}.fan.rate"] = r[f"{label}.fan_rate"]
    RESULTS[f"{kind}.fan.broker_us"] = r[f"{label}.fan_cpu"] / 10_000 * 1e6
    RESULTS[f"{kind}.pub.rate"] = r[f"{label}.pub_rate"]
    RESULTS[f"{kind}.pub.broker_us"] = r[f"{label}.pub_cpu_us"]
    RESULTS[f"{kind}.pub.harness_us"] = r[f"{label}.pub_client_us"]  # the Python publisher
    RESULTS[f"{kind}.drain.rate"] = DRAIN / r[f"{label}.drain_s"]
    RESULTS[f"{kind}.drain.broker_us"] = r[f"{label}.drain_cpu"] / DRAIN * 1e6
    assert RESULTS[f"{kind}.fan.broker_us"] > 0, f"{fan} notifications cost no CPU?"
    LOAD.append(f"{label} end {_load()}")


def test_report() -> None:
    """Prints every figure of this run and the CPU ratios (run the whole file)."""
    r = RESULTS
    cases = {
        "fan": f"fan-out {FAN_PUBS}x{N_SUBS}",
        "pub": f"publish {DRAIN} (1 recipient)",
        "drain": f"drain {DRAIN}",
    }
    print("\n\nload average: " + "; ".join(LOAD))
    print("\n| case | system | rate /s | broker CPU per message | harness CPU |")
    print("|---|---|---|---|---|")
    for key, name in cases.items():
        for system in ("mosquitto", "sqlite", "postgresql"):
            base = f"{key}.rate" if system == "mosquitto" else f"{system}.{key}.rate"
            if base not in r:
                continue
            prefix = base.removesuffix(".rate")
            harness = ""
            if f"{prefix}.harness_us" in r and system != "mosquitto":
                harness = f"{r[f'{prefix}.harness_us']:.1f} µs/message (publisher)"
            if system == "mosquitto":
                harness = (
                    f"{r[f'{key}.harness_us']:.1f} µs/message, "
                    f"{r[f'{key}.harness_cores']:.2f} cores"
                )
            label = "Mosquitto, C clients" if system == "mosquitto" else f"mdeci, {system}"
            print(
                f"| {name} | {label} | {r[base]:.0f} | "
                f"{r[f'{prefix}.broker_us']:.1f} µs | {harness} |"
            )
    for key, name in cases.items():
        if f"{key}.harness_us" in r:  # what the harness alone could carry per core
            print(f"Mosquitto harness, {name}: {1e6 / r[f'{key}.harness_us']:.0f}/s per core")
    if "fan1.harness_s" in r and "fan.harness_s" in r:
        fixed = r["fan1.harness_s"]
        extra = (r["fan.harness_s"] - fixed) / ((FAN_PUBS - 1) * N_SUBS) * 1e6
        print(
            f"\nMosquitto harness, fan-out: {fixed:.2f} s CPU for {N_SUBS} subscribers with 1 "
            f"message each (start-up handshake and exit); {extra:.1f} µs per further message"
        )
    for system in ("sqlite", "postgresql"):
        if f"{system}.idle_cores" in r:
            idle = r[f"{system}.idle_cores"]
            print(f"mdeci, {system}: idle after the run, {idle * 1e3:.1f} ms of CPU per second")
    print("\nbroker CPU per delivered message, mdeci / Mosquitto (<= 1: mdeci cheaper):")
    for key, name in cases.items():
        for system in ("sqlite", "postgresql"):
            if f"{system}.{key}.broker_us" in r and f"{key}.broker_us" in r:
                ratio = r[f"{system}.{key}.broker_us"] / r[f"{key}.broker_us"]
                print(f"  {name}, {system}: {ratio:.2f}")
    assert r, "run the whole file: the report needs the other tests' figures"
