"""The client commands against a real broker and agent: pub's exit codes tell accepted,
kept and refused apart; sub while disconnected; tail's readable form (the default on a
terminal); the filter type check."""

from __future__ import annotations

import asyncio
import os
import pty
import sys

import pytest

from mdeci.cli import main
from mdeci.commands.client import EXIT_LATER, EXIT_REFUSED
from mdeci.frames import MAX_FRAME_BYTES
from tests.agent.farend import GUARD
from tests.client.conftest import Deployment


async def cli(*argv: str) -> int:
    # main() runs its own event loop for tail: in a thread, beside the agent's.
    return await asyncio.wait_for(asyncio.to_thread(main, list(argv)), GUARD)


async def broker_gone(dep: Deployment) -> None:
    await dep.stop_broker()
    await asyncio.wait_for(
        dep.alice.agent.wait_until(lambda: dep.alice.status().status.value != "CONNECTED"),
        GUARD,
    )


async def test_pub_exit_codes_tell_accepted_kept_and_refused_apart(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(deployment.socket)
    assert await cli("pub", "stocks.a", "--payload", "x", "--socket", sock) == 0
    assert capsys.readouterr().out.startswith("published ")
    # Fits a pub frame, not the notify it would become: the broker refuses it (413).
    big = "x" * (MAX_FRAME_BYTES - 300)
    assert await cli("pub", "stocks.a", "--payload", big, "--socket", sock) == EXIT_REFUSED
    assert "refused" in capsys.readouterr().err
    await broker_gone(deployment)
    assert await cli("pub", "stocks.a", "--payload", "y", "--socket", sock) == EXIT_LATER
    assert capsys.readouterr().out.startswith("buffered ")


async def test_sub_while_disconnected_exits_3_and_waits_when_asked(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(deployment.socket)
    await broker_gone(deployment)
    assert await cli("sub", "stocks.*", "--socket", sock) == EXIT_LATER
    assert "not connected" in capsys.readouterr().err
    waiting = asyncio.create_task(cli("sub", "stocks.*", "--wait", "10", "--socket", sock))
    await deployment.start_broker()
    assert await waiting == 0
    assert capsys.readouterr().out.startswith("subscribed ")


async def test_tail_is_readable_unless_json_is_asked(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(deployment.socket)
    await deployment.alice.agent.subscribe("stocks.*")
    await deployment.bob.publish("stocks.a", {"Stock": "PETR4", "Price": 24.5}, b"buy it")
    await deployment.bob.publish("stocks.a", {}, b"\xff\x00")
    assert await cli("tail", "--from", "1", "--count", "2", "--text", "--socket", sock) == 0
    first, second = capsys.readouterr().out.splitlines()
    assert first.startswith("#1 ") and first.endswith(' stocks.a Price=24.5 Stock=PETR4 "buy it"')
    assert second.endswith("stocks.a <2 bytes>")
    assert await cli("tail", "--from", "1", "--count", "1", "--json", "--socket", sock) == 0
    assert capsys.readouterr().out.startswith('{"nseq":1,')
    # Not a terminal (pytest's capture): JSON lines, as scripts read them.
    assert await cli("tail", "--from", "2", "--count", "1", "--socket", sock) == 0
    assert capsys.readouterr().out.startswith('{"nseq":2,')


async def test_tail_on_a_terminal_is_readable_by_default(deployment: Deployment) -> None:
    await deployment.alice.agent.subscribe("stocks.*")
    await deployment.bob.publish("stocks.a", {"Stock": "PETR4"}, b"on a tty")
    parent, child = pty.openpty()
    argv = ["-m", "mdeci", "tail", "--from", "1", "--count", "1", "--socket"]
    proc = await asyncio.create_subprocess_exec(
        sys.executable, *argv, str(deployment.socket), stdout=child, stderr=child
    )
    os.close(child)
    try:
        assert await asyncio.wait_for(proc.wait(), GUARD) == 0
        out = os.read(parent, 4096).decode()
    finally:
        os.close(parent)
    assert out.startswith("#1 ") and out.rstrip().endswith('stocks.a Stock=PETR4 "on a tty"'), out


async def test_sub_refuses_a_filter_comparing_a_number_with_a_string(
    deployment: Deployment, capsys: pytest.CaptureFixture[str]
) -> None:
    sock = str(deployment.socket)
    await deployment.alice.agent.subscribe("stocks.*")
    await deployment.bob.publish("stocks.a", {"Stock": "PETR4", "Price": 24.5}, b"1")
    await deployment.alice.agent.wait_until(lambda: deployment.alice.status().highest_nseq >= 1)
    code = await cli("sub", "stocks.*", "--filter", "Price < 'abc'", "--socket", sock)
    err = capsys.readouterr().err
    assert code == 2
    assert "filter type error: Price is a number" in err and "--no-type-check" in err
    assert len(err.splitlines()) == 1
    assert await cli("sub", "stocks.*", "--filter", "Price < 25", "--socket", sock) == 0
    assert await cli("sub", "other.*", "--filter", "Price < 'abc'", "--socket", sock) == 0
    flag = ("--no-type-check", "--socket", sock)
    assert await cli("sub", "stocks.*", "--filter", "Price < 'abc'", *flag) == 0
