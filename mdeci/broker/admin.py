"""The broker's local admin socket (``admin_socket``, mode 0600): what ``mdeci admin``
needs from the running process rather than from the store.

One JSON object per line each way. Requests: ``{"op": "kick", "uri":
"sip:alice@example.org"}`` (BYE, delivery stopped), ``{"op": "drain"}`` (out of service:
503 to new INVITEs and OPTIONS, every session ended with BYE; answers ``ended``, how many;
:mod:`mdeci.broker.drain`) and ``{"op": "sessions"}`` (the stored sessions with queue
depth and subscriptions, as ``mdeci admin sessions`` prints).
Answers carry ``"ok": true`` or ``"ok": false, "error": "..."``. Users need no socket:
they live in the store, which digest authentication reads at each request (``mdeci admin users``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from mdeci.errors import MdeciError
from mdeci.store import ops
from mdeci.store.errors import StoreError

MAX_LINE = 64 * 1024


class AdminError(MdeciError):
    """The admin socket cannot be reached or refused the request."""


class Kicker(Protocol):
    def kick(self, uri: str) -> bool: ...

    def drain(self) -> int: ...


class AdminServer:
    """Serves admin requests on a Unix socket (owner only). :meth:`start`, :meth:`close`."""

    def __init__(
        self,
        path: Path,
        engine: Any,
        endpoint: Kicker,
        clock: Callable[[], float],
    ) -> None:
        self.path = path
        self.engine = engine
        self.endpoint = endpoint
        self.clock = clock
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        """Raises AdminError when another broker listens there; OSError."""
        if self.path.exists():
            if _alive(self.path):
                raise AdminError(f"another broker is listening on {self.path}")
            self.path.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        old = os.umask(0o177)  # born 0600: no window in which others could connect
        try:
            self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        finally:
            os.umask(old)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
            with contextlib.suppress(OSError):
                self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while line := await reader.readline():
                answer = await self.handle(line)
                writer.write((json.dumps(answer) + "\n").encode())
                await writer.drain()
        except (ConnectionError, asyncio.LimitOverrunError, ValueError):
            pass
        finally:
            writer.close()

    async def handle(self, line: bytes) -> dict[str, Any]:
        """One request line; never raises (bad input gets ``ok: false``)."""
        try:
            req = json.loads(line)
        except ValueError:
            return {"ok": False, "error": "not a JSON object"}
        if not isinstance(req, dict):
            return {"ok": False, "error": "not a JSON object"}
        op = req.get("op")
        if op == "sessions":
            try:
                rows = await asyncio.to_thread(ops.sessions, self.engine, self.clock())
            except StoreError as exc:
                return {"ok": False, "error": f"store: {exc}"}
            return {"ok": True, "items": [asdict(r) for r in rows]}
        if op == "kick":
            uri = req.get("uri")
            if not isinstance(uri, str) or not uri.startswith(("sip:", "sips:")):
                return {"ok": False, "error": "'uri' must be a SIP URI"}
            if not self.endpoint.kick(uri):
                return {"ok": False, "error": f"{uri} has no session"}
            return {"ok": True, "kicked": uri}
        if op == "drain":
            return {"ok": True, "ended": self.endpoint.drain()}
        return {"ok": False, "error": f"unknown op {op!r}"}


def broker_running(path: Path) -> bool:
    """Whether a broker listens on the admin socket ``path`` (on this host)."""
    return _alive(path)


def _alive(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def call(path: Path, request: dict[str, Any], timeout: float = 10.0) -> dict[str, Any]:
    """One request to the admin socket, synchronously (the CLI). Raises :class:`AdminError`."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            sock.connect(str(path))
            sock.sendall((json.dumps(request) + "\n").encode())
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
        except OSError as exc:
            raise AdminError(
                f"cannot reach the broker at {path} ({exc.strerror or exc}): is it running?"
            ) from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise AdminError("the broker answered something that is not JSON") from None
    if not isinstance(answer, dict) or not answer.get("ok"):
        error = answer.get("error") if isinstance(answer, dict) else None
        raise AdminError(str(error or "the broker refused the request"))
    return answer
