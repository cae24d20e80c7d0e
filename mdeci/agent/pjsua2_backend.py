"""The pjsua2 SIP backend: PJSIP (the ``pjsua2-python`` wheel) carries out the core's SIP
commands; the RUDP data channel is the same as with our stack.

pjsua2 aborts the whole process on misuse and allows one Endpoint per process
(docs/pjsip.md), so it runs in a child process of its own
(:mod:`mdeci.agent.pjsua2_worker`), one per backend: nothing pjsua2 does can end the
daemon, and several agents may share a process (the tests). Commands and outcomes travel
as JSON lines over the child's stdin and stdout; this side awaits a future per command.
If the child dies, every command fails (status None) and the current dialog is reported
ended, so the core starts over with a fresh child.

The SDP: pjsua keeps no call without audio, so the child puts an inactive audio line
before the core's application line; the key agreement binds the offer as sent
(docs/security.md), so the outcome carries that body too (``SipOutcome.offer``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import Callable, Mapping
from typing import Any

from mdeci.agent.errors import AgentError
from mdeci.agent.events import (
    Address,
    Bye,
    Invite,
    MoveSip,
    Register,
    Reinvite,
    SipCommand,
    SipOutcome,
)
from mdeci.config import AgentConfig, HostPort
from sip.errors import SipParseError
from sip.uri import SipUri

INSTALL_HINT = "pip install pjsua2-python"
START_TIMEOUT = 30.0  # the child imports pjsua2 and opens its socket; the machine may be busy
CLOSE_TIMEOUT = 5.0
TIMER_B_T1 = 64  # RFC 3261 Timer B = 64*T1: how long an unanswered request is waited for


def _hostport(addr: HostPort) -> str:
    return f"[{addr.host}]:{addr.port}" if ":" in addr.host else f"{addr.host}:{addr.port}"


def worker_settings(config: AgentConfig) -> dict[str, Any]:
    """The child's settings (its first stdin line). Raises :class:`AgentError`."""
    sip = config.sip
    transport = sip.transports[0]
    if transport == "tls" and sip.tls_cert is not None:
        raise AgentError(
            '[sip] stack = "pjsua2" does not listen for TLS: leave tls_cert and tls_key '
            'unset (the broker answers over the connection the agent opened) or use stack = "mdeci"'
        )
    # The config checked both AORs are sip:user@domain.
    try:
        user, broker = SipUri.parse(config.aor).user, SipUri.parse(config.broker.aor).user
    except SipParseError as exc:
        raise AgentError(f"pjsua2 backend: {exc}") from None
    # pjsua picks a request's transport by the target URI's parameter.
    param = "" if transport == "udp" else f";transport={transport}"
    where = _hostport(config.broker.address)
    return {
        "aor": config.aor,
        "user": user,
        "password": config.password,
        "transport": transport,
        "tls_ca": str(sip.tls_ca) if sip.tls_ca is not None else "",
        "registrar": _hostport(config.registrar.address) + param,
        "broker_aor": config.broker.aor,
        # The request goes to the broker's address; To stays its AOR.
        "broker_target": f"sip:{broker}@{where}{param}",
        "host": config.sip.host,
        "port": config.sip.port,
        "t1": config.sip.t1,
        "t2": config.sip.t2,
        "t4": config.sip.t4,
    }


def _address(value: object) -> Address | None:
    if isinstance(value, list) and len(value) == 2 and isinstance(value[1], int):
        return (str(value[0]), value[1])
    return None


def _bytes(value: object) -> bytes:
    return str(value).encode("latin-1", "replace") if isinstance(value, str) else b""


def outcome_of(reply: dict[str, Any]) -> SipOutcome:
    """A child's reply line as an outcome (bodies travel as latin-1 text); a field of
    the wrong type reads as absent."""
    status, call_id, contacts = reply.get("status"), reply.get("call_id"), reply.get("contacts")
    return SipOutcome(
        status=status if isinstance(status, int) and not isinstance(status, bool) else None,
        reason=str(reply.get("reason", "")),
        body=_bytes(reply.get("body")),
        offer=_bytes(reply.get("offer")),
        call_id=call_id if isinstance(call_id, str) and call_id else None,
        local_addr=_address(reply.get("local")),
        contacts=tuple(str(c) for c in contacts) if isinstance(contacts, list) else (),
    )


class Pjsua2Backend:
    """PJSIP in a child process (module docstring)."""

    name = "pjsua2"

    def __init__(self, config: AgentConfig, random_bytes: Callable[[int], bytes]) -> None:
        self.config = config
        self._settings = worker_settings(config)
        self.transport: str = self._settings["transport"]
        self._proc: asyncio.subprocess.Process | None = None
        self._reader: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._next_id = 0
        self._on_bye: Callable[[str], None] = lambda call_id: None
        self._call_id: str | None = None
        self._local: Address = (config.sip.host, config.sip.port)
        self._expires: int | None = None  # of our registration; None: not registered
        self.errors: list[str] = []  # what the child reported from its callbacks
        self._received = 0  # SIP messages the child saw arrive (all its children together)
        self._counted = 0  # of the current child

    @property
    def received(self) -> Mapping[str, int]:
        return {self.transport: self._received + self._counted}

    @property
    def contact(self) -> str:
        if self._proc is None:
            return ""
        host, port = self._local
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        param = "" if self.transport == "udp" else f";transport={self.transport}"
        return f"sip:{self._settings['user']}@{where}{param}"

    async def start(self, on_bye: Callable[[str], None]) -> Address:
        self._on_bye = on_bye
        await self._spawn()
        return self._local

    async def _spawn(self) -> None:
        try:
            import pjsua2  # noqa: F401
        except ImportError:
            raise AgentError(
                f'[sip] stack = "pjsua2" needs the pjsua2 binding: {INSTALL_HINT}'
            ) from None
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "mdeci.agent.pjsua2_worker",
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=1 << 20,
        )  # fmt: skip
        assert proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(json.dumps(self._settings).encode() + b"\n")
            await proc.stdin.drain()
            line = await asyncio.wait_for(proc.stdout.readline(), START_TIMEOUT)
            ready = json.loads(line) if line.strip() else {}
        except (OSError, TimeoutError, ValueError) as exc:
            await self._kill(proc)
            raise AgentError(f"pjsua2 backend did not start: {exc!r}") from None
        if ready.get("event") != "ready":
            await self._kill(proc)
            raise AgentError(f"pjsua2 backend did not start: {ready.get('reason', ready)}")
        local = _address(ready.get("local"))
        if local is not None:
            self._local = local
        self._proc = proc
        self._reader = asyncio.create_task(self._read(proc))

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        assert proc.stdout is not None
        try:
            while line := await proc.stdout.readline():
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if isinstance(msg, dict):
                    self._message(msg)
        finally:
            self._child_gone(proc)

    def _message(self, msg: dict[str, Any]) -> None:
        received = msg.get("received")
        if isinstance(received, int) and not isinstance(received, bool):
            self._counted = received
        event = msg.get("event")
        if event == "bye":
            call_id = str(msg.get("call_id", ""))
            if call_id and call_id == self._call_id:
                self._call_id = None
                self._on_bye(call_id)
        elif event == "error":
            self.errors.append(f"{msg.get('where')}: {msg.get('error')}")
        elif isinstance(msg.get("id"), int):
            future = self._waiting.pop(msg["id"], None)
            if future is not None and not future.done():
                future.set_result(msg)

    def _child_gone(self, proc: asyncio.subprocess.Process) -> None:
        """The child ended (an abort inside pjsua2, or we closed it)."""
        if self._proc is not proc:
            return  # an earlier child, already replaced
        self._proc = None
        self._received += self._counted
        self._counted = 0
        for future in self._waiting.values():
            if not future.done():
                future.set_result({"status": None, "reason": "pjsua2 process ended"})
        self._waiting.clear()
        if self._call_id is not None:
            call_id, self._call_id = self._call_id, None
            self._on_bye(call_id)

    @property
    def pid(self) -> int | None:
        """The pjsua2 process's id; None while none runs."""
        return self._proc.pid if self._proc is not None else None

    async def execute(self, command: SipCommand, *, timeout: float | None = None) -> SipOutcome:
        if self._proc is None:
            restored = await self._respawn(command, timeout)
            if restored is not None:
                return restored
        request: dict[str, Any]
        if isinstance(command, Register):
            request = {"op": "register", "expires": command.expires}
        elif isinstance(command, Invite):
            request = {"op": "invite", "offer": command.offer.decode("latin-1")}
        elif isinstance(command, Reinvite):
            request = {"op": "reinvite", "offer": command.offer.decode("latin-1")}
        elif isinstance(command, MoveSip):
            request = {"op": "move", "host": command.host}
        else:
            request = {"op": "bye"}
        # Without a timeout, as long as a transaction of the daemon's own timers lasts.
        limit = timeout if timeout is not None else TIMER_B_T1 * self.config.sip.t1 + 1.0
        reply = await self._ask(request, limit)
        outcome = outcome_of(reply)
        if outcome.local_addr is not None:
            self._local = outcome.local_addr
        if isinstance(command, Register) and outcome.ok:
            self._expires = command.expires or None
        elif isinstance(command, Invite) and outcome.ok:
            self._call_id = outcome.call_id
        elif isinstance(command, Bye):
            self._call_id = None
        return outcome

    async def _respawn(self, command: SipCommand, timeout: float | None) -> SipOutcome | None:
        """A fresh child after the last one died, where the daemon is now, registered
        again if the core believes it is (it knows nothing of the child): None, or the
        failure that ends ``command``."""
        self._settings = {**self._settings, "host": self._local[0], "port": 0}
        try:
            await self._spawn()
        except (AgentError, OSError) as exc:
            return SipOutcome(status=None, reason=str(exc))
        if self._expires is None or isinstance(command, Register):
            return None
        limit = timeout if timeout is not None else TIMER_B_T1 * self.config.sip.t1 + 1.0
        outcome = outcome_of(await self._ask({"op": "register", "expires": self._expires}, limit))
        return None if outcome.ok else outcome

    async def _ask(self, request: dict[str, Any], timeout: float) -> dict[str, Any]:
        proc = self._proc
        if proc is None or proc.stdin is None:
            return {"status": None, "reason": "pjsua2 process ended"}
        self._next_id += 1
        ident = self._next_id
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._waiting[ident] = future
        try:
            proc.stdin.write(json.dumps({"id": ident, **request}).encode() + b"\n")
            await proc.stdin.drain()
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return {"status": None, "reason": "no answer", "local": list(self._local)}
        except (OSError, RuntimeError) as exc:
            return {"status": None, "reason": f"pjsua2 process: {exc}"}
        finally:
            self._waiting.pop(ident, None)

    async def close(self) -> None:
        proc, reader = self._proc, self._reader
        self._call_id = None  # closing: no BYE report for what we end ourselves
        if proc is not None:
            await self._kill(proc)
        if reader is not None:
            with contextlib.suppress(asyncio.CancelledError):
                await reader

    @staticmethod
    async def _kill(proc: asyncio.subprocess.Process) -> None:
        # End of stdin ends the child (its protocol); it is killed if it does not.
        if proc.stdin is not None:
            with contextlib.suppress(OSError, RuntimeError):
                proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), CLOSE_TIMEOUT)
        except TimeoutError:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
