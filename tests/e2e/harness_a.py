"""Helpers of the end-to-end tests of matching, handover and disconnection.

Real processes: ``python -m mdeci broker|agent`` started as children with
``sys.executable`` from the repository root (so they run this worktree's code), each
read until its one readiness line, stopped by PID at the end. In-process parts use
:func:`mdeci.broker.app.run_broker` and :func:`mdeci.agent.daemon.run_agent`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mdeci.agent.api import ApiClient
from mdeci.agent.errors import ApiError

ROOT = Path(__file__).resolve().parents[2]
# Guards against a hang; they synchronise nothing. A cold broker start migrates a fresh
# SQLite file, and the machine is shared, so they are generous.
GUARD = 60.0
STATUS_POLL = 0.05  # the local API has no "wait until CONNECTED" request: see wait_status

# Quick retransmissions; ACKs after 2 ms rather than the default 20 ms: an agent's
# publish waits for the RUDP ACK of its `pub` (then for `pub-ok`), so with the default
# each of 1,000 sequential publishes costs >= 20 ms.
FAST_RUDP = "rto_initial = 0.2\nrto_min = 0.05\nrto_max = 1.0\nmax_retries = 4\nack_delay = 0.002"

STOCKS = ("PETR4", "VALE3", "ITUB4", "BBDC4", "ABEV3")
STOCK_FILTER = "(Stock == 'PETR4') and (Price < 25)"


# ------------------------------------------------------------------ events


def stock_event(i: int) -> dict[str, Any]:
    """Event ``i`` of the deterministic stream: Stock cycles over five names, Price over
    10.0 .. 39.9 (a stride coprime with 300, so every pair of the two cycles occurs)."""
    return {"Stock": STOCKS[i % len(STOCKS)], "Price": 10.0 + ((i * 37) % 300) / 10.0}


def stock_matches(attrs: dict[str, Any]) -> bool:
    """``STOCK_FILTER`` evaluated in Python, to compute the expected subset."""
    return attrs["Stock"] == "PETR4" and float(attrs["Price"]) < 25


# ------------------------------------------------------------------ config files


def broker_toml(
    data_dir: Path,
    *,
    users: Sequence[str] = ("alice", "bob"),
    rudp: str = "",
    queue: str = "",
    transports: Sequence[str] = (),
) -> str:
    """A broker config with quick SIP timers; ports are given on the command line;
    ``transports``: its ``[media] transports`` (the default when empty)."""
    lines = [
        'node = "broker-e2e"',
        'domain = "localhost"',
        f'data_dir = "{data_dir}"',
        "[sip]",
        'host = "127.0.0.1"',
        "t1 = 0.05",
        "t2 = 0.4",
        "t4 = 0.5",
        "[rudp]",
        rudp or FAST_RUDP,
    ]
    if queue:
        lines += ["[queue]", queue]
    if transports:
        lines += ["[media]", "transports = [" + ", ".join(f'"{t}"' for t in transports) + "]"]
    for user in users:
        lines += ["[[auth.users]]", f'user = "{user}"', f'password = "{user}-secret"']
    return "\n".join(lines) + "\n"


def agent_toml(
    state_dir: Path,
    user: str,
    host: str,
    broker: tuple[str, int],
    *,
    rudp: str = "",
    ip_monitor: str = 'mode = "poll"\npoll_interval = 600.0',
    stack: str = "mdeci",
    transport: str = "rudp",
    media: str = "",
) -> str:
    """An agent of ``user`` (password ``<user>-secret``) bound to ``host``, on the SIP
    backend ``stack``, offering the data channel ``transport`` (``[media] transport``);
    ``media``: more lines of its ``[media]`` table."""
    address = f"{broker[0]}:{broker[1]}"
    return (
        "\n".join(
            [
                f'node = "{user}-phone"',
                f'aor = "sip:{user}@localhost"',
                f'password = "{user}-secret"',
                f'state_dir = "{state_dir}"',
                "[registrar]",
                f'address = "{address}"',
                "[broker]",
                'aor = "sip:broker@localhost"',
                f'address = "{address}"',
                "[sip]",
                f'host = "{host}"',
                "port = 0",
                "t1 = 0.05",
                "t2 = 0.4",
                "t4 = 0.5",
                f'stack = "{stack}"',
                "[media]",
                f'host = "{host}"',
                f'transport = "{transport}"',
                media,
                "[rudp]",
                rudp or FAST_RUDP,
                "[reconnect]",
                "base = 0.05",
                "max = 0.5",
                "jitter = 0.2",
                "[ip_monitor]",
                ip_monitor,
            ]
        )
        + "\n"
    )


# ------------------------------------------------------------------ child processes


@dataclass(slots=True, eq=False)
class Child:
    """A started ``mdeci`` child process and its readiness line."""

    name: str
    proc: asyncio.subprocess.Process
    ready: str
    stderr_path: Path
    words: dict[str, str] = field(default_factory=dict)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stderr(self) -> str:
        with contextlib.suppress(OSError):
            return self.stderr_path.read_text(errors="replace")
        return ""


async def spawn(
    name: str,
    args: Sequence[str],
    logs: Path,
    *,
    prefix: Sequence[str] = (),
) -> Child:
    """Start ``[*prefix, python, -m, mdeci, *args]`` and wait for its first stdout line.

    ``prefix`` runs it through another command (``ip netns exec NS``). Stderr goes to a
    file (a pipe nobody reads could fill and block the child). Fails the test with the
    child's stderr if it exits before printing.
    """
    logs.mkdir(parents=True, exist_ok=True)
    err_path = logs / f"{name}.stderr"
    with err_path.open("wb") as err:
        proc = await asyncio.create_subprocess_exec(
            *prefix, sys.executable, "-m", "mdeci", *args,
            cwd=ROOT, stdout=asyncio.subprocess.PIPE, stderr=err,
            stdin=asyncio.subprocess.DEVNULL,
        )  # fmt: skip
    child = Child(name, proc, "", err_path)
    assert proc.stdout is not None
    try:
        line = (await asyncio.wait_for(proc.stdout.readline(), GUARD)).decode().strip()
    except BaseException:
        await stop(child)
        raise
    if not line:
        await stop(child)
        raise AssertionError(f"{name} exited before its ready line: {child.stderr()}")
    child.ready = line
    for word in line.split():
        key, sep, value = word.partition("=")
        if sep:
            child.words[key] = value
    return child


async def stop(child: Child, sig: int = signal.SIGTERM) -> int:
    """Stop ``child`` by its PID (SIGCONT first, in case a test left it stopped), kill it
    if it does not exit in time; its exit code."""
    proc = child.proc
    if proc.returncode is None:
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(signal.SIGCONT)
            proc.send_signal(sig)
        try:
            await asyncio.wait_for(proc.wait(), 15.0)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
    return int(proc.returncode or 0)


async def start_broker(tmp: Path, config_text: str) -> tuple[Child, tuple[str, int]]:
    """``python -m mdeci broker`` on free loopback ports; the child and its SIP address."""
    config = tmp / "broker.toml"
    config.write_text(config_text)
    child = await spawn(
        "broker",
        ["broker", "--config", str(config), "--listen-sip", "127.0.0.1:0",
         "--listen-media", "127.0.0.1:0"],
        tmp / "logs",
    )  # fmt: skip
    words = child.ready.split()
    assert words[:2] == ["broker", "listening"], child.ready
    host, _, port = child.words["sip"].rpartition(":")
    return child, (host, int(port))


async def start_agent(
    tmp: Path, name: str, config_text: str, *, prefix: Sequence[str] = ()
) -> tuple[Child, Path]:
    """``python -m mdeci agent``; the child and its API socket."""
    config = tmp / f"{name}.toml"
    config.write_text(config_text)
    child = await spawn(name, ["agent", "--config", str(config)], tmp / "logs", prefix=prefix)
    assert child.ready.startswith("agent sip:"), child.ready
    return child, Path(child.words["api"])


async def run_cli(*args: str) -> str:
    """``python -m mdeci <args>`` to completion; its stdout (fails on a non-zero exit)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "mdeci", *args, cwd=ROOT,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
    )  # fmt: skip
    out, err = await asyncio.wait_for(proc.communicate(), GUARD)
    assert proc.returncode == 0, f"mdeci {args[0]}: exit {proc.returncode}: {err.decode()}"
    return out.decode()


def run_ip(*args: str) -> None:
    """``ip <args>`` (network namespace set-up); raises with its stderr on failure."""
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


# ------------------------------------------------------------------ local API


async def api_status(sock: Path) -> dict[str, Any]:
    async with ApiClient(sock) as client:
        status: dict[str, Any] = (await client.call({"op": "status"}))["status"]
        return status


async def wait_status(sock: Path, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
    """Poll the agent's ``status`` until ``predicate`` holds.

    The local API offers no request that waits for a state change, so a client in
    another process can only ask again; the interval is short and ``GUARD`` bounds it.
    """

    async def go() -> dict[str, Any]:
        while True:
            with contextlib.suppress(ApiError):
                status = await api_status(sock)
                if predicate(status):
                    return status
            await asyncio.sleep(STATUS_POLL)

    return await asyncio.wait_for(go(), GUARD)


def is_connected(status: dict[str, Any]) -> bool:
    return bool(status["status"] == "CONNECTED")


class Tail:
    """An application reading ``tail`` on an agent's API socket into a list."""

    def __init__(self, sock: Path, from_nseq: int | None = 1) -> None:
        self.sock = sock
        self.from_nseq = from_nseq
        self.records: list[dict[str, Any]] = []
        self.times: list[float] = []  # loop.time() of each arrival
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    async def start(self) -> Tail:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        async with ApiClient(self.sock) as client:
            async for record in client.tail(self.from_nseq):
                self.records.append(record)
                self.times.append(loop.time())
                self._changed.set()

    async def wait_count(self, count: int) -> list[dict[str, Any]]:
        """Return once ``count`` notifications arrived (fails if the stream ends)."""
        while len(self.records) < count:
            if self._task is not None and self._task.done():
                self._task.result()
                raise AssertionError(f"tail ended after {len(self.records)} of {count}")
            self._changed.clear()
            await self._changed.wait()
        return self.records

    async def wait_until(
        self, predicate: Callable[[list[dict[str, Any]]], bool]
    ) -> list[dict[str, Any]]:
        """Return once ``predicate(records)`` holds (checked after each arrival)."""
        while not predicate(self.records):
            if self._task is not None and self._task.done():
                self._task.result()
                raise AssertionError(f"tail ended after {len(self.records)}")
            self._changed.clear()
            await self._changed.wait()
        return self.records

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, ApiError, OSError):
                await self._task


def check_exactly(records: Sequence[dict[str, Any]], expected: Sequence[str]) -> None:
    """``records`` carry exactly the payload texts ``expected``, in order, with strictly
    increasing nseq (no loss, no duplicate, order kept)."""
    texts = [r.get("text") for r in records]
    nseqs = [int(r["nseq"]) for r in records]
    missing = sorted(set(expected) - set(t for t in texts if t is not None))
    dups = len(texts) - len(set(texts))
    assert not missing, f"lost {len(missing)}: {missing[:10]}"
    assert dups == 0, f"{dups} duplicated"
    assert texts == list(expected), "order not kept"
    assert all(a < b for a, b in itertools.pairwise(nseqs)), "nseq not increasing"


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method."""
    ordered = sorted(values)
    rank = max(1, min(len(ordered), int(-(-q * len(ordered) // 1))))
    return ordered[rank - 1]
