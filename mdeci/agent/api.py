"""The agent's local API: JSON lines over a Unix socket (``docs/agent.md``).

Every request is one JSON object on one line with an ``op``; every answer is one line:
``{"ok": true, ...}`` or ``{"ok": false, "error": "..."}``. ``tail`` turns the
connection into a stream of ``{"notify": {...}}`` lines. One connection may carry many
requests, one at a time.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import ipaddress
import json
import os
import socket
from asyncio import FIRST_COMPLETED
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mdeci.agent.errors import ApiError, BrokerRefused, NotConnected
from mdeci.errors import FilterError, FrameError, MdeciError, SubjectError
from mdeci.frames import CalendarRule

if TYPE_CHECKING:  # the client side (mdeci status, ...) must not import the daemon
    from mdeci.agent.aio import Agent

MAX_LINE = 4 << 20  # bytes per request line (a publish payload travels base64 in it)


def _error(message: str, code: int | None = None, kind: str = "bad_request") -> dict[str, Any]:
    """An ``ok: false`` answer; ``kind`` lets a client tell a broker's refusal
    (``refused``, with ``code``), a session that is down (``not_connected``: retry later)
    and a request the agent could not take (``bad_request``, ``error``) apart."""
    out: dict[str, Any] = {"ok": False, "error": message, "kind": kind}
    if code is not None:
        out["code"] = code
    return out


def _payload(req: dict[str, Any]) -> bytes:
    if "payload" in req and req["payload"] is not None:
        try:
            return base64.b64decode(str(req["payload"]), validate=True)
        except (binascii.Error, ValueError):
            raise ApiError("'payload' must be base64 (use 'text' for text)") from None
    text = req.get("text")
    return str(text).encode("utf-8") if text is not None else b""


def _calendar_rules(raw: object) -> list[CalendarRule]:
    if not isinstance(raw, list) or not all(isinstance(r, dict) for r in raw):
        raise ApiError("'rules' must be a list of objects")
    return [CalendarRule(**rule) for rule in raw]  # bad keys: TypeError; values: FrameError


class ApiServer:
    """Serves an :class:`Agent` on ``path``."""

    def __init__(self, agent: Agent, path: Path) -> None:
        self.agent = agent
        self.path = path
        self._server: asyncio.base_events.Server | None = None
        self._streams: set[asyncio.StreamWriter] = set()
        self._tails: set[asyncio.Task[Any]] = set()

    async def start(self) -> None:
        """Listen (a stale socket file left by a crash is replaced).

        Raises :class:`ApiError` if another agent is listening there, :class:`OSError`.
        """
        if self.path.exists():
            if _alive(self.path):
                raise ApiError(f"another agent is listening on {self.path}")
            self.path.unlink()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._server = await asyncio.start_unix_server(self._serve, self.path, limit=MAX_LINE)
        with contextlib.suppress(OSError):
            os.chmod(self.path, 0o600)  # the owner's applications only

    async def close(self) -> None:
        """Stop listening; the socket file is removed only if this server made it."""
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._streams):
            writer.close()
        tails = list(self._tails)
        for task in tails:
            task.cancel()
        await asyncio.gather(*tails, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._server.wait_closed()
        self._server = None
        with contextlib.suppress(OSError):
            self.path.unlink()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._streams.add(writer)
        try:
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError):
                    await self._write(writer, _error("request line too long"))
                    return
                if not line:
                    return
                try:
                    req = json.loads(line)
                except ValueError:
                    await self._write(writer, _error("request is not JSON"))
                    continue
                if not isinstance(req, dict):
                    await self._write(writer, _error("request must be a JSON object"))
                    continue
                if req.get("op") == "tail":
                    await self._tail(req, reader, writer)
                    return
                await self._write(writer, await self.handle(req))
        except (ConnectionError, OSError):
            return
        finally:
            self._streams.discard(writer)
            writer.close()

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, obj: dict[str, Any]) -> None:
        writer.write((json.dumps(obj, separators=(",", ":")) + "\n").encode())
        await writer.drain()

    async def handle(self, req: dict[str, Any]) -> dict[str, Any]:
        """Answer one request object (never raises)."""
        agent = self.agent
        op = req.get("op")
        try:
            if op == "status":
                return {"ok": True, "status": agent.status().to_json()}
            if op == "sub":
                ttl = req.get("ttl")
                lease = req.get("lease", True)
                if not isinstance(lease, bool):
                    raise ApiError("'lease' must be true (renewed) or false (a fixed TTL)")
                ok = await agent.subscribe(
                    str(req.get("subject", "")),
                    str(req.get("filter") or ""),
                    int(ttl) if ttl is not None else None,
                    qclass=str(req.get("qclass") or ""),
                    lease=lease,
                    in_order=bool(req.get("in_order", False)),
                )
                return {
                    "ok": True,
                    "sub_id": ok.sub_id,
                    "expires_at": ok.expires_at,
                    "lease": lease,
                }
            if op == "calendar":
                done = await agent.send_calendar(
                    _calendar_rules(req.get("rules")), int(req.get("utc_offset_minutes", 0))
                )
                return {"ok": True, "rules": done.rules}
            if op == "unsub":
                await agent.unsubscribe(str(req.get("sub_id", "")))
                return {"ok": True}
            if op == "subs":
                stale = not agent.connected
                if not stale:
                    await agent.list_subscriptions()  # the broker's list updates the record
                items = agent.subscription_states
                return {"ok": True, "stale": stale, "items": [s.to_json() for s in items]}
            if op == "pub":
                attrs = req.get("attrs") or {}
                if not isinstance(attrs, dict):
                    raise ApiError("'attrs' must be an object")
                result = await agent.publish(
                    str(req.get("subject", "")),
                    attrs,
                    _payload(req),
                    urgent=bool(req.get("urgent", False)),
                    qclass=str(req.get("qclass") or ""),
                    timeout=agent.config.pub_timeout,
                )
                return {
                    "ok": True,
                    "msg_id": result.msg_id,
                    "state": result.state,
                    "matched": result.matched,
                }
            if op == "move":
                address = str(req.get("address", ""))
                try:
                    ipaddress.ip_address(address)
                except ValueError:
                    raise ApiError(f"'address' {address[:60]!r} is not an IP address") from None
                before = agent.status()
                try:
                    await agent.move_to(address)
                except OSError as exc:
                    raise ApiError(f"cannot bind {address}: {exc.strerror or exc}") from None
                status = agent.status()
                if status.state == "BACKOFF" or status.failed_attempts > before.failed_attempts:
                    # The REGISTER or the re-INVITE there was refused or unanswered: bound
                    # to the new address, but not reachable on it; the agent tries again.
                    return _error(
                        f"moved to {status.sip_addr}, but {status.last_error or 'the move failed'}",
                        kind="move_failed",
                    )
                return {"ok": True, "sip_addr": status.sip_addr, "media_addr": status.media_addr}
            return _error(f"unknown op {str(op)[:40]!r}")
        except BrokerRefused as exc:
            return _error(str(exc), exc.code, "refused")
        except NotConnected as exc:
            return _error(str(exc), kind="not_connected")
        except (ApiError, FrameError, FilterError, SubjectError) as exc:
            return _error(str(exc))
        except MdeciError as exc:
            return _error(str(exc), kind="error")
        except (TypeError, ValueError) as exc:
            return _error(f"bad request: {exc}")

    async def _tail(
        self, req: dict[str, Any], reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> None:
        queue = self.agent.listen()
        try:
            start = req.get("from")
            last = 0
            if isinstance(start, int) and not isinstance(start, bool):
                for record in self.agent.delivered_since(start):
                    await self._write(writer, {"notify": record})
                    last = int(record["nseq"])
            await self._write(writer, {"ok": True, "live": True})
            # The client sends nothing more: end of its stream means it went away (then
            # it no longer counts as a listener).
            gone = asyncio.ensure_future(reader.read(1))
            self._tails.add(gone)
            try:
                while True:
                    got = asyncio.ensure_future(queue.get())
                    done, _ = await asyncio.wait({got, gone}, return_when=FIRST_COMPLETED)
                    if got not in done:
                        got.cancel()
                        return
                    record = got.result()
                    if "nseq" not in record:
                        await self._write(writer, {"event": record})
                    elif int(record["nseq"]) > last:
                        await self._write(writer, {"notify": record})
            finally:
                gone.cancel()
                self._tails.discard(gone)
        finally:
            self.agent.unlisten(queue)


def _alive(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


# ------------------------------------------------------------------ client


class ApiClient:
    """One connection to the agent's API (async context manager)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> ApiClient:
        try:
            self._reader, self._writer = await asyncio.open_unix_connection(
                self.path, limit=MAX_LINE
            )
        except OSError:
            raise ApiError(
                f"cannot reach the agent at {self.path}: is `mdeci agent` running?"
            ) from None
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.wait_closed()

    async def _send(self, obj: dict[str, Any]) -> None:
        assert self._writer is not None
        self._writer.write((json.dumps(obj) + "\n").encode())
        await self._writer.drain()

    async def _line(self) -> dict[str, Any]:
        assert self._reader is not None
        line = await self._reader.readline()
        if not line:
            raise ApiError("the agent closed the connection")
        obj = json.loads(line)
        if not isinstance(obj, dict):
            raise ApiError("the agent answered something that is not a JSON object")
        return obj

    async def call(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Send one request; its answer. Raises :class:`ApiError` for ``ok: false``."""
        try:
            await self._send(obj)
            answer = await self._line()
        except (OSError, ConnectionError, ValueError) as exc:
            raise ApiError(f"agent connection failed: {exc}") from None
        if not answer.get("ok"):
            raise ApiError(str(answer.get("error", "the agent refused the request")))
        return answer

    async def tail(
        self, from_nseq: int | None = None, *, events: bool = False
    ) -> AsyncGenerator[dict[str, Any], None]:
        """Notifications (kept ones from ``from_nseq`` first, then live ones); with
        ``events``, the stream's ``{"event": {...}}`` lines too, as they are."""
        request: dict[str, Any] = {"op": "tail"}
        if from_nseq is not None:
            request["from"] = from_nseq
        await self._send(request)
        while True:
            obj = await self._line()
            if "notify" in obj:
                yield obj["notify"]
            elif events and "event" in obj:
                yield obj
            elif obj.get("ok") is False:
                raise ApiError(str(obj.get("error")))
