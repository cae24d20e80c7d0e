"""A publisher that retries what the broker refuses, as docs/faults.md tells applications to.

It speaks the agent's local API (JSON lines on the agent's Unix socket) itself, rather than
through :class:`~mdeci.agent.api.ApiClient`, because it needs the ``code`` of a refusal,
which ``ApiClient.call`` folds into its exception text.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GUARD = 60.0  # one answer of the agent; a guard, it synchronises nothing
RETRY_DELAY = 0.1  # seconds between a refusal and the retry of the same publish
MAX_REFUSALS = 2000  # bounds the loop whatever the broker answers


@dataclass(frozen=True, slots=True)
class Refusal:
    """One ``ok: false`` answer to a publish: the index published and what the agent said."""

    index: int
    code: int | None
    error: str


class ApiLine:
    """One connection to an agent's local API: :meth:`call` sends a request and returns
    the answer as it is, ``ok: false`` included."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, socket: Path) -> ApiLine:
        reader, writer = await asyncio.open_unix_connection(socket, limit=1 << 22)
        return cls(reader, writer)

    async def call(self, request: dict[str, Any]) -> dict[str, Any]:
        self._writer.write((json.dumps(request) + "\n").encode())
        await self._writer.drain()
        line = await asyncio.wait_for(self._reader.readline(), GUARD)
        if not line:
            raise AssertionError("the agent closed its API connection")
        answer: dict[str, Any] = json.loads(line)
        return answer

    async def close(self) -> None:
        self._writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await self._writer.wait_closed()


class RetryingPublisher:
    """Publishes ``{prefix}{i}`` for i in 0..count-1 at ``rate`` per second, one request at
    a time (so the broker gets them in order); a refused one is retried after
    :data:`RETRY_DELAY` until the agent takes it (``published``, ``sent`` or ``buffered``:
    the agent's outbox then owns it)."""

    def __init__(
        self,
        socket: Path,
        subject: str,
        count: int,
        rate: float,
        *,
        prefix: str = "t",
        payload_bytes: int = 0,
    ) -> None:
        self.socket = socket
        self.subject = subject
        self.count = count
        self.interval = 1.0 / rate
        self.prefix = prefix
        self.padding = "x" * payload_bytes
        self.taken: list[str] = []  # texts the agent took, in order
        self.states: dict[str, int] = {}  # answer state -> how many
        self.refusals: list[Refusal] = []
        self._changed = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def text(self, i: int) -> str:
        return f"{self.prefix}{i}"

    def start(self) -> RetryingPublisher:
        self._task = asyncio.create_task(self._run())
        return self

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        line = await ApiLine.open(self.socket)
        try:
            start = loop.time()
            for i in range(self.count):
                delay = start + i * self.interval - loop.time()
                if delay > 0:  # pacing: the offered load, not synchronisation
                    await asyncio.sleep(delay)
                request = {
                    "op": "pub", "subject": self.subject, "attrs": {"i": i},
                    "text": self.text(i) + ("|" + self.padding if self.padding else ""),
                }  # fmt: skip
                while True:
                    answer = await line.call(request)
                    if answer.get("ok"):
                        state = str(answer.get("state"))
                        self.states[state] = self.states.get(state, 0) + 1
                        self.taken.append(self.text(i))
                        break
                    code = answer.get("code")
                    self.refusals.append(
                        Refusal(i, None if code is None else int(code), str(answer.get("error")))
                    )
                    self._changed.set()
                    if len(self.refusals) >= MAX_REFUSALS:
                        raise AssertionError(f"{MAX_REFUSALS} refusals: {self.refusals[-1]}")
                    await asyncio.sleep(RETRY_DELAY)  # a retry delay, not synchronisation
                self._changed.set()
        finally:
            await line.close()

    async def wait(self, *, taken: int = 0, refused: int = 0) -> None:
        """Return once at least ``taken`` publishes were taken and ``refused`` refusals
        came (fails if the publisher stopped first)."""
        while len(self.taken) < taken or len(self.refusals) < refused:
            if self._task is not None and self._task.done():
                self._task.result()
                raise AssertionError(
                    f"publisher ended with {len(self.taken)} taken, {len(self.refusals)} refused"
                )
            self._changed.clear()
            await asyncio.wait_for(self._changed.wait(), GUARD)

    async def finish(self) -> None:
        """Wait for the last publish to be taken."""
        assert self._task is not None
        await asyncio.wait_for(self._task, GUARD + self.count * self.interval)

    async def close(self) -> None:
        if self._task is not None and not self._task.done():
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
