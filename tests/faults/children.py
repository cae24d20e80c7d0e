"""The processes and clients of one fault run, each stopped or closed when the run ends."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar

from mdeci.agent.api import ApiClient
from tests.e2e.harness_a import GUARD, Child, Tail, is_connected, start_broker, stop, wait_status
from tests.faults.publisher import ApiLine, RetryingPublisher

T = TypeVar("T")


async def start_all(started: list[Child], *starts: Awaitable[tuple[Child, Path]]) -> list[Path]:
    """Run ``starts`` (``start_agent`` calls) concurrently; every child that started is
    appended to ``started`` (for the caller's clean-up) even when another one failed,
    then the first failure is raised. The API sockets, in the order given."""
    results = await asyncio.gather(*starts, return_exceptions=True)
    failure: BaseException | None = None
    sockets = []
    for result in results:
        if isinstance(result, BaseException):
            failure = failure or result
        else:
            started.append(result[0])
            sockets.append(result[1])
    if failure is not None:
        raise failure
    return sockets


async def subscribe(sock: Path, subject: str, ttl: int = 600) -> dict[str, Any]:
    async with ApiClient(sock) as client:
        return await asyncio.wait_for(
            client.call({"op": "sub", "subject": subject, "ttl": ttl}), GUARD
        )


class Run:
    """What a fault run starts: every child is stopped by its PID and every client closed
    on exit, in the reverse order of their start, whether the run ended or failed."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Run:
        await self._stack.__aenter__()
        return self

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self._stack.__aexit__(kind, exc, tb)

    def later(self, callback: Callable[[], Awaitable[object]]) -> None:
        """``callback`` runs when the run ends (before what was started earlier stops)."""
        self._stack.push_async_callback(callback)

    def on_exit(self, callback: Callable[[], object]) -> None:
        """A blocking ``callback`` (a namespace or server to tear down) run on a thread."""
        self._stack.push_async_callback(asyncio.to_thread, callback)

    async def child(self, start: Awaitable[tuple[Child, T]]) -> tuple[Child, T]:
        child, extra = await start
        self._stack.push_async_callback(stop, child)
        return child, extra

    async def broker(self, toml: str) -> tuple[Child, tuple[str, int]]:
        return await self.child(start_broker(self.tmp, toml))

    async def agents(self, *starts: Awaitable[tuple[Child, Path]]) -> list[tuple[Child, Path]]:
        """The agents started at once (see :func:`start_all`), each with its API socket."""
        started: list[Child] = []
        try:
            sockets = await start_all(started, *starts)
        finally:
            for agent in started:
                self._stack.push_async_callback(stop, agent)
        return list(zip(started, sockets, strict=True))

    async def subscribed_pair(
        self, alice: Awaitable[tuple[Child, Path]], bob: Awaitable[tuple[Child, Path]], subject: str
    ) -> tuple[tuple[Child, Path], tuple[Child, Path]]:
        """alice and bob connected, alice subscribed to ``subject``."""
        (a, a_sock), (b, b_sock) = await self.agents(alice, bob)
        await wait_status(a_sock, is_connected)
        await wait_status(b_sock, is_connected)
        await subscribe(a_sock, subject)
        return (a, a_sock), (b, b_sock)

    async def tail(self, sock: Path) -> Tail:
        tail = await Tail(sock).start()
        self._stack.push_async_callback(tail.close)
        return tail

    async def line(self, sock: Path) -> ApiLine:
        line = await ApiLine.open(sock)
        self._stack.push_async_callback(line.close)
        return line

    def publisher(self, publisher: RetryingPublisher) -> RetryingPublisher:
        self._stack.push_async_callback(publisher.close)
        return publisher.start()
