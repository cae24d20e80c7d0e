"""The churn job on a real standalone Spark cluster (master + worker).

The master and the worker are the JVMs of the pyspark installation, started here on
loopback with their own ports, work and log folders; ``mdeci analytics churn --master
spark://...`` then runs in a fresh process as an admin would run it, and its tasks run
in an executor that the worker launched. Both JVMs are stopped by PID in ``finally``.

Everything is sized for a shared 2-core machine: one core and 1 GB for the worker, a
512 MB executor and driver, one shuffle partition, a log of eight users over a day.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pytest

from tests.analytics.logs import line
from tests.analytics.test_watch import expected, minute_lines, storm_lines, user
from tests.peers import free_port, require_binary

ROOT = Path(__file__).resolve().parents[2]
USERS = 8
STARTUP_S = 60.0  # guard for each JVM to come up (about 8 s each on an idle machine)
JOB_S = 240.0  # guard for the churn run (35-75 s here, depending on the other load)


def _spark_home() -> Path:
    pyspark = pytest.importorskip("pyspark")
    return Path(pyspark.__file__).parent


def _wait_for(
    what: str, ready: Callable[[], bool], alive: Callable[[], bool], guard: float
) -> None:
    """Poll ``ready`` (a JVM is another process: there is no event to await) until it
    holds; fail early if ``alive`` says the process died, and after ``guard`` seconds."""
    deadline = time.monotonic() + guard
    while not ready():
        if not alive():
            pytest.fail(f"{what}: the process exited")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {guard:.0f} s")
        time.sleep(0.25)


def _master_json(webui: int) -> dict[str, Any]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{webui}/json/", timeout=2) as r:
            data: dict[str, Any] = json.load(r)
            return data
    except (OSError, ValueError):
        return {}


# --- who listens where: /proc, since nothing like psutil is installed -----------------


def _descendants(pids: Iterable[int]) -> set[int]:
    """``pids`` and every process below them (the worker's executor, the driver's JVM)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue  # exited while we looked
        ppid = int(text.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(stat.parent.name))
    found: set[int] = set()
    todo = list(pids)
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo.extend(children.get(pid, []))
    return found


def _address(hex_addr: str) -> str:
    raw = bytes.fromhex(hex_addr)
    # /proc/net/tcp{,6} print each 32-bit word of the address in host (little-endian) order.
    words = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return socket.inet_ntop(socket.AF_INET if len(raw) == 4 else socket.AF_INET6, words)


def listening(pids: Iterable[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state held by ``pids``."""
    inodes: set[str] = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found: set[tuple[str, int]] = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            cols = row.split()
            if cols[3] == "0A" and cols[9] in inodes:  # 0A: TCP_LISTEN
                host, port = cols[1].split(":")
                found.add((_address(host), int(port, 16)))
    return found


LOOPBACK = {"127.0.0.1", "::ffff:127.0.0.1", "::1"}


def test_listening_reads_this_process_sockets() -> None:
    """The /proc reader itself: a socket of ours on loopback is seen with its port."""
    with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s6, socket.socket() as s4:
        s6.bind(("::ffff:127.0.0.1", 0))
        s6.listen()
        s4.bind(("127.0.0.1", 0))
        s4.listen()
        seen = listening([os.getpid()])
        assert ("::ffff:127.0.0.1", s6.getsockname()[1]) in seen
        assert ("127.0.0.1", s4.getsockname()[1]) in seen


# --- the cluster ------------------------------------------------------------------------


def _stop(proc: subprocess.Popen[bytes] | subprocess.Popen[str] | None) -> None:
    """Stop one of our JVMs by its PID: SIGTERM runs Spark's shutdown hooks (the worker
    kills its executors), SIGKILL only if that hangs."""
    if proc is None or proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


def _tail(path: Path, n: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return f"({path} not written)"


@pytest.mark.peer("spark")
@pytest.mark.slow
# Four JVMs (master, worker, then the churn and watch drivers with their executors) take
# minutes of the two shared cores: a long run, so ``make bench`` runs it, not ``make test``.
@pytest.mark.bench
@pytest.mark.timeout(900)
def test_churn_on_a_standalone_master_and_worker(tmp_path: Path) -> None:
    require_binary("java", "apt-get install openjdk-17-jre-headless")
    spark_home = _spark_home()
    spark_class = spark_home / "bin" / "spark-class"
    from analytics.generate import GeneratorConfig, generate

    gen = generate(
        GeneratorConfig(
            users=USERS,
            days=1,
            seed=5,
            users_per_shard=4,  # two files, so two input partitions
            duplicate_fraction=0.0,  # exact counts to compare with
            reorder_fraction=0.0,
            malformed_fraction=0.0,
        ),
        tmp_path / "log",
        parquet=False,
    )

    port, master_ui, worker_ui, worker_port = (free_port(socket.SOCK_STREAM) for _ in range(4))
    conf = tmp_path / "conf"
    conf.mkdir()
    # spark-submit (which pyspark runs for the driver) reads this; the CLI needs no
    # --conf for a cluster, as on a real one (docs/analytics.md, "Running on a cluster").
    (conf / "spark-defaults.conf").write_text(
        "spark.driver.memory 512m\n"
        "spark.executor.memory 512m\n"
        "spark.cores.max 1\n"
        "spark.driver.host 127.0.0.1\n"
        "spark.driver.bindAddress 127.0.0.1\n"
        "spark.ui.enabled false\n"
        "spark.ui.showConsoleProgress false\n"
        # For a few thousand events, compiling whole-stage code and re-planning each
        # shuffle cost more than they save (runs of 40-85 s with both off, 70-110 s with
        # both on, on the shared 2-core machine); the jobs' results do not depend on them.
        "spark.sql.codegen.wholeStage false\n"
        "spark.sql.adaptive.enabled false\n"
    )
    env = {
        **os.environ,
        "SPARK_HOME": str(spark_home),
        "SPARK_CONF_DIR": str(conf),
        "SPARK_LOCAL_IP": "127.0.0.1",  # also where the web UIs bind (else 0.0.0.0)
        "SPARK_WORKER_DIR": str(tmp_path / "work"),
        "SPARK_LOG_DIR": str(tmp_path / "logs"),
        "SPARK_DAEMON_MEMORY": "384m",
        # The REST submission server would take the fixed port 6066: not ours to take.
        "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
        "PYSPARK_PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),
    }
    url = f"spark://127.0.0.1:{port}"
    master_args = ["--host", "127.0.0.1", "--port", str(port), "--webui-port", str(master_ui)]
    worker_args = ["--host", "127.0.0.1", "--port", str(worker_port), "--cores", "1"]
    worker_args += ["--memory", "1g", "--webui-port", str(worker_ui)]
    churn_args = ["--input", str(tmp_path / "log" / "jsonl"), "--output", str(tmp_path / "out")]
    churn_args += ["--shuffle-partitions", "1", "--no-csv"]
    begun = time.monotonic()
    marks: dict[str, float] = {}
    master: subprocess.Popen[bytes] | None = None
    worker: subprocess.Popen[bytes] | None = None
    churn: subprocess.Popen[bytes] | None = None
    watch: subprocess.Popen[str] | None = None
    watch_log = tmp_path / "watch.log"
    master_log, worker_log, churn_log = (
        tmp_path / f"{n}.log" for n in ("master", "worker", "churn")
    )
    try:
        with master_log.open("wb") as out:
            master = subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.master.Master", *master_args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        m = master
        _wait_for(
            f"master {url}\n{_tail(master_log)}",
            lambda: _master_json(master_ui).get("status") == "ALIVE",
            lambda: m.poll() is None,
            STARTUP_S,
        )
        marks["master up"] = time.monotonic() - begun
        with worker_log.open("wb") as out:
            worker = subprocess.Popen(
                [str(spark_class), "org.apache.spark.deploy.worker.Worker", url, *worker_args],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        w = worker
        _wait_for(
            f"worker registering with {url}",
            lambda: _master_json(master_ui).get("aliveworkers") == 1,
            lambda: w.poll() is None,
            STARTUP_S,
        )

        marks["cluster up"] = time.monotonic() - begun
        with churn_log.open("wb") as out:
            churn = subprocess.Popen(
                [sys.executable, "-m", "mdeci", "analytics", "churn", "--master", url, *churn_args],
                cwd=ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        c = churn
        # While the job runs, watch every socket the cluster, its executor and the
        # driver listen on: all must be on loopback.
        jvms = [master.pid, worker.pid, churn.pid]
        seen: set[tuple[str, int]] = set()
        executor_seen = False

        def done() -> bool:
            nonlocal executor_seen
            tree = _descendants(jvms)
            seen.update(listening(tree))
            executor_seen |= len(_descendants([w.pid])) > 1
            return c.poll() is not None

        _wait_for("churn on the cluster", done, lambda: True, JOB_S)
        marks["churn done"] = time.monotonic() - begun
        assert churn.returncode == 0, _tail(churn_log, 40)

        # The live query on the same cluster: two files in the folder (minutes 0 and 1,
        # a storm in 1; and a line ten minutes on, so the watermark passes both). It is
        # stopped (SIGINT, by PID) once it has printed both minutes.
        live_in, live_out = tmp_path / "live-logs", tmp_path / "live"
        live_in.mkdir()
        first = minute_lines(0) + minute_lines(1) + storm_lines(1)
        (live_in / "churn.log.1").write_text("\n".join(first) + "\n")
        ahead = line(600, "registered", user(0), role="broker")
        (live_in / "churn.log.2").write_text(ahead + "\n")
        watch_args = ["--input", str(live_in), "--output", str(live_out), "--master", url]
        watch_args += ["--watermark", "60 seconds", "--trigger", "1", "--for", str(JOB_S)]
        watch = subprocess.Popen(
            [sys.executable, "-m", "mdeci", "analytics", "watch", *watch_args],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=watch_log.open("wb"),
            text=True,
        )
        assert watch.stdout is not None
        printed = []
        for text in watch.stdout:  # one line per final minute: the event we wait for
            printed.append(text.strip())
            if len(printed) == 2:
                watch.send_signal(signal.SIGINT)
        watch.wait(timeout=60)
        marks["watch done"] = time.monotonic() - begun
        assert watch.returncode == 0, _tail(watch_log, 40)
    finally:
        _stop(watch)
        _stop(churn)
        _stop(worker)
        _stop(master)

    log = churn_log.read_text()
    assert f"on {url}" in log, log[-3000:]  # Spark reports the master it was given
    assert "Exception" not in log, log[-3000:]
    assert seen and {host for host, _ in seen} <= LOOPBACK, seen
    assert {port, master_ui, worker_ui, worker_port} <= {p for _, p in seen}
    assert executor_seen, "the worker never launched an executor"
    # The tasks ran in the worker's executor: it left the app's folder and its stderr.
    # Two apps: churn, then watch (app ids sort by start time).
    apps = sorted((tmp_path / "work").glob("app-*/0/stderr"))
    assert len(apps) == 2
    assert all("Successfully registered with driver" in a.read_text() for a in apps)

    import pyarrow.parquet as pq

    tables = tmp_path / "out"
    summary = {r["metric"]: r["value"] for r in pq.read_table(tables / "summary").to_pylist()}
    assert summary["lines"] == gen.lines
    assert summary["invalid_lines"] == 0 and summary["duplicates_dropped"] == 0
    assert summary["events"] == gen.events
    assert summary["users"] == USERS
    per_user = pq.read_table(tables / "per_user").to_pylist()
    assert len(per_user) == USERS
    # Each agent copy of a broker fact (a restore's media_connected, a session end) is a
    # line of the log and an event, but not counted per user.
    copies = summary["other_role_copies"]
    assert copies > 0
    assert sum(r["events"] for r in per_user) == summary["events_in_window"] == gen.events - copies
    assert sum(r["disconnections"] for r in per_user) == summary["disconnections"] > 0
    episodes = pq.read_table(tables / "episodes")
    assert episodes.num_rows == summary["disconnections"]
    hours = pq.read_table(tables / "per_hour").to_pylist()
    assert 0 < len(hours) <= 26  # hours of one day (a session may run past midnight)
    assert sum(r["disconnections"] for r in hours) == summary["disconnections"]
    for table in ("transitions", "restore_latency", "flapping", "storms", "recommendations"):
        assert list((tables / table).glob("*.parquet")), table
    assert pq.read_table(tables / "recommendations").num_rows > 0
    print(f"churn on {url}: {gen.events} events; {marks}; listening: {sorted(seen)}")

    # The live minutes equal the independent count of tests/analytics/test_watch.py.
    want = expected([first], late=set())
    assert len(printed) == 2 and "STORM: 12 users reconnected" in printed[1], printed
    minutes = sorted(pq.read_table(live_out / "minutes").to_pylist(), key=lambda r: r["minute"])
    assert len(minutes) == 2
    for minute, row in enumerate(minutes):
        assert row["handovers"] == want[minute]["handovers"]
        assert row["disconnections"] == want[minute]["disconnections"]
        assert row["restores"] == len(want[minute]["lat"])
        assert row["storm"] == (minute == 1)
    assert pq.read_table(live_out / "alerts").num_rows == 1
