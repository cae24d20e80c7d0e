"""The broker's SQLite store on a disk that fills up.

The store file lives on a 4 MB tmpfs of the test's own, beside 1 MB of ballast (what an
operator deletes to free space). alice subscribes and goes offline, so every accepted
publish stays queued for her; bob publishes 16 KB payloads through his agent's local API
until the broker refuses, and a few more. A SIP OPTIONS probe and ``/readyz`` are asked
before, while full and after. The ballast is deleted; bob publishes again; alice comes
back and receives. The run (once per module) is shared by the tests below.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sip.aio.ua import UaConfig, UserAgent
from sip.transaction import TimerConfig
from tests.e2e.harness_a import (
    GUARD,
    Child,
    agent_toml,
    broker_toml,
    check_exactly,
    start_agent,
    stop,
    wait_status,
)
from tests.faults.children import Run
from tests.faults.publisher import Refusal
from tests.faults.tmpfs import Tmpfs

pytestmark = pytest.mark.slow

SIZE = "4m"
BALLAST = 1 << 20
PAYLOAD = 16 * 1024
MAX_PUBLISHES = 400  # bounds the filling whatever the broker answers
READY_FREE = 4 * PAYLOAD  # store.min_free_bytes: room for a few publishes
REFUSED_IN_A_ROW = 5  # publishes refused one after another: the disk is full
AFTER = 5  # publishes accepted after the space is freed
SUBJECT = "faults.disk"
INTERNAL = re.compile(
    r"OperationalError|sqlite|sqlalchemy|\bSQL\b|INSERT|UPDATE|Traceback|Error:", re.IGNORECASE
)
STORAGE_FULL = re.compile(r"storage full", re.IGNORECASE)


@dataclass(frozen=True)
class FullDiskRun:
    accepted: list[str]  # texts bob's agent was answered ``published`` for, in order
    refusals: list[Refusal]
    accepted_after_free: list[str]
    options: list[tuple[str, int]]  # (phase, status) of each OPTIONS probe
    ready: list[tuple[str, int, str]]  # (phase, status, body) of each /readyz
    errors_logged_while_full: list[str]  # the broker's database_error lines until freed
    received: list[dict[str, Any]]
    broker_alive: bool


def _text(i: int) -> str:
    return f"d{i}"


def _request(i: int) -> dict[str, Any]:
    return {
        "op": "pub", "subject": SUBJECT, "attrs": {"i": i},
        "text": _text(i) + "|" + "x" * PAYLOAD,
    }  # fmt: skip


async def _options(ua: UserAgent, broker: tuple[str, int]) -> int:
    request = ua.build_request("OPTIONS", f"sip:broker@{broker[0]}", to="<sip:broker@localhost>")
    return (await asyncio.wait_for(ua.request(request, broker), GUARD)).status


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=GUARD) as answer:
            return int(answer.status), answer.read().decode()
    except urllib.error.HTTPError as exc:
        return int(exc.code), exc.read().decode()


async def _readyz(broker: Child, phase: str) -> tuple[str, int, str]:
    status, body = await asyncio.to_thread(_get, f"http://{broker.words['metrics']}/readyz")
    return phase, status, body


async def _run(tmp: Path) -> FullDiskRun:
    ua = UserAgent(
        UaConfig(
            aor="sip:prober@localhost",
            username="prober",
            password="-",
            timers=TimerConfig(t1=0.05, t2=0.4, t4=0.5),
        )
    )
    async with Run(tmp) as run:
        disk = Tmpfs(SIZE)
        run.on_exit(disk.close)
        ballast = disk.path / "ballast"
        ballast.write_bytes(b"\0" * BALLAST)
        toml = broker_toml(tmp / "broker") + f'[store]\nurl = "sqlite:///{disk.path}/broker.db"\n'
        toml += f"min_free_bytes = {READY_FREE}\n[metrics]\nenabled = true\nport = 0\n"
        broker, sip = await run.broker(toml)
        run.later(ua.close)
        await ua.start("127.0.0.1", 0)
        alice_toml = agent_toml(tmp / "alice", "alice", "127.0.0.1", sip)
        (alice, _), (_, b_sock) = await run.subscribed_pair(
            start_agent(tmp, "alice", alice_toml),
            start_agent(tmp, "bob", agent_toml(tmp / "bob", "bob", "127.0.0.1", sip)),
            SUBJECT,
        )
        await stop(alice)  # offline: what is accepted stays queued on the small disk
        options = [("before", await _options(ua, sip))]
        ready = [await _readyz(broker, "before")]

        line = await run.line(b_sock)
        accepted: list[str] = []
        refusals: list[Refusal] = []
        in_a_row = 0
        i = 0
        while in_a_row < REFUSED_IN_A_ROW and i < MAX_PUBLISHES:
            answer = await line.call(_request(i))
            if answer.get("ok"):
                assert answer["state"] == "published", answer
                accepted.append(_text(i))
                in_a_row = 0
            else:
                code = answer.get("code")
                refusals.append(Refusal(i, None if code is None else int(code), answer["error"]))
                in_a_row += 1
                options.append(("full", await _options(ua, sip)))
                ready.append(await _readyz(broker, "full"))
                url = f"http://{broker.words['metrics']}/metrics"  # a read that works
                assert (await asyncio.to_thread(_get, url))[0] == 200
            i += 1
        assert in_a_row == REFUSED_IN_A_ROW, f"the disk never filled in {MAX_PUBLISHES} publishes"

        errors = [x for x in broker.stderr().splitlines() if "database_error" in x]
        ballast.unlink()  # the operator frees space
        after: list[str] = []
        for _ in range(MAX_PUBLISHES):
            if len(after) == AFTER:
                break
            answer = await line.call(_request(i))
            if answer.get("ok"):
                after.append(_text(i))
            else:
                code = answer.get("code")
                refusals.append(Refusal(i, None if code is None else int(code), answer["error"]))
            i += 1
        options.append(("after", await _options(ua, sip)))
        ready.append(await _readyz(broker, "after"))

        _, a_sock = await run.child(start_agent(tmp, "alice", alice_toml))
        tail = await run.tail(a_sock)
        expected = len(accepted) + len(after)
        await asyncio.wait_for(tail.wait_count(expected), GUARD)
        await wait_status(a_sock, lambda s: s["highest_nseq"] >= expected)
        return FullDiskRun(
            accepted=accepted,
            refusals=refusals,
            accepted_after_free=after,
            options=options,
            ready=ready,
            errors_logged_while_full=errors,
            received=list(tail.records),
            broker_alive=broker.proc.returncode is None,
        )


@pytest.fixture(scope="module")
def full_disk() -> Iterator[FullDiskRun]:
    with tempfile.TemporaryDirectory(prefix="mdeci-faults-disk-") as tmp:
        yield asyncio.run(_run(Path(tmp)))


def test_every_accepted_publish_is_delivered_and_no_refused_one(full_disk: FullDiskRun) -> None:
    assert full_disk.accepted, "nothing was accepted before the disk filled"
    records = [{**r, "text": str(r.get("text")).partition("|")[0]} for r in full_disk.received]
    check_exactly(records, [*full_disk.accepted, *full_disk.accepted_after_free])
    print(
        f"\nfull disk ({SIZE} tmpfs, {PAYLOAD // 1024} KB payloads): "
        f"{len(full_disk.accepted)} accepted, {len(full_disk.refusals)} refused, "
        f"{len(full_disk.accepted_after_free)} accepted after freeing space; all delivered once"
    )


def test_publishes_are_accepted_again_once_space_is_freed(full_disk: FullDiskRun) -> None:
    assert len(full_disk.accepted_after_free) == AFTER
    assert full_disk.broker_alive


def test_options_is_answered_throughout(full_disk: FullDiskRun) -> None:
    phases = {phase for phase, _ in full_disk.options}
    assert phases == {"before", "full", "after"}
    assert all(status == 200 for _, status in full_disk.options), full_disk.options


def test_a_refused_publish_gets_an_error(full_disk: FullDiskRun) -> None:
    assert full_disk.refusals
    assert all(r.code is not None and r.code >= 500 for r in full_disk.refusals)


def test_a_refused_publish_names_storage_full_without_internal_text(
    full_disk: FullDiskRun,
) -> None:
    for refusal in full_disk.refusals:
        assert STORAGE_FULL.search(refusal.error), refusal
        assert not INTERNAL.search(refusal.error), refusal


def test_readyz_says_not_ready_while_the_store_cannot_write(full_disk: FullDiskRun) -> None:
    """Reads, and a small write, still work on a nearly full disk; a publish does not."""
    by_phase = {phase: [(status, body) for p, status, body in full_disk.ready if p == phase]
                for phase in ("before", "full", "after")}  # fmt: skip
    assert by_phase["before"] == [(200, "ready\n")], full_disk.ready
    assert by_phase["after"] == [(200, "ready\n")], full_disk.ready
    assert by_phase["full"], full_disk.ready
    for status, body in by_phase["full"]:
        assert status == 503 and body.startswith("not ready: database:"), full_disk.ready
        assert "full" in body, full_disk.ready


def test_the_full_spell_is_logged_once_whatever_is_read_meanwhile(full_disk: FullDiskRun) -> None:
    """Refused publishes, /readyz and /metrics scrapes between them: one outage, one line."""
    assert len(full_disk.refusals) >= 2
    assert len(full_disk.errors_logged_while_full) == 1, full_disk.errors_logged_while_full
