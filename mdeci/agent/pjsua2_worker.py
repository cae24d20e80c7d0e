"""The pjsua2 process of the agent's pjsua2 SIP backend (:mod:`mdeci.agent.pjsua2_backend`).

pjsua2 aborts the whole process on misuse (docs/pjsip.md) and allows one Endpoint per
process, so it runs here, in a child of the daemon: an abort ends this process only, and
the daemon sees a failed outcome. One thread owns the Endpoint and polls
``libHandleEvents``; a reader thread only moves stdin lines into a queue. Every callback
catches everything (SWIG would print and swallow it).

Protocol, one JSON object per line. The parent writes the settings first, then commands
``{"id": N, "op": "register"|"invite"|"reinvite"|"move"|"bye", ...}``; we answer each with
``{"id": N, "status": ..., ...}`` (the fields of :class:`~mdeci.agent.events.SipOutcome`,
bodies as latin-1 text) and report ``{"event": "ready"|"bye"|"error", ...}``. End of stdin
ends the process at once (the daemon is gone or closing; nothing is left to tidy).

usage: python -m mdeci.agent.pjsua2_worker   (settings on the first stdin line)
"""

from __future__ import annotations

import ctypes
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pjsua2 as pj

# An inactive audio line before our application line: pjsua keeps no call without audio
# (docs/pjsip.md). Port 9 (discard): the loop media transport never sends to it.
AUDIO_PLACEHOLDER = "m=audio 9 RTP/AVP 0\r\na=rtpmap:0 PCMU/8000\r\na=inactive\r\n"
AUTH_CHALLENGES = (401, 407)
# libHandleEvents returns early for network events, not for our stdin: its timeout is
# how late a command may be seen. Short while the daemon is likely to send one (a
# command in flight, or one answered lately: a move is MoveSip then Reinvite), longer
# when all is quiet.
IDLE_POLL_MS = 10
BUSY_POLL_MS = 1
BUSY_FOR = 0.2  # seconds after an answer


# Transports kept open after a move (the newest is in use): pjsua has eight slots, and a
# closed one keeps its slot while the transactions that used it linger.
KEEP_TRANSPORTS = 3


def _padding() -> Any:
    """A ``Padding`` header for requests that go without credentials first: the broker
    answers an unauthenticated request only with no more bytes than it got
    (docs/security.md), and its challenge is larger than pjsua's bare REGISTER or INVITE.
    Smaller than our stack's padding (sip.ua.UaConfig.pad_to), since pjsua keeps it on
    the retry with credentials, which must stay under the 1300 bytes that move to TCP."""
    header = pj.SipHeader()
    header.hName = "Padding"
    header.hValue = "x" * 400
    return header


def _bye_param() -> Any:
    """The parameter of a hangup whose BYE the broker challenges: padded (_padding)."""
    prm = pj.CallOpParam(True)
    prm.txOption.headers.append(_padding())
    return prm


class _Out:
    stream = sys.stdout
    received = 0  # SIP messages pjsua reported to us (responses, in-dialog requests)


def emit(**fields: Any) -> None:
    fields["received"] = _Out.received
    _Out.stream.write(json.dumps(fields) + "\n")
    _Out.stream.flush()


def keep_stdout_for_us() -> None:
    """The protocol keeps the real stdout; what PJSIP prints there (its banner, before
    any log setting applies) is dropped. Its assertion messages go to stderr."""
    sys.stdout.flush()
    _Out.stream = os.fdopen(os.dup(1), "w", buffering=1)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)
    os.close(devnull)


def media_slots(offer: str) -> int:
    """The media lines pjsua sends for ``offer``: the placeholder and each of ours (two
    with ``[media] transport = "auto"``)."""
    return 1 + sum(1 for line in offer.splitlines() if line.startswith("m="))


def with_placeholder(offer: str) -> str:
    """``offer`` with the inactive audio line inserted before its first media line."""
    lines = offer.replace("\r\n", "\n").split("\n")
    first_media = next((i for i, line in enumerate(lines) if line.startswith("m=")), len(lines))
    session = "".join(line + "\r\n" for line in lines[:first_media] if line)
    media = "".join(line + "\r\n" for line in lines[first_media:] if line)
    return session + AUDIO_PLACEHOLDER + media


def set_timers(t1: float, t2: float, t4: float) -> None:
    """The agent's SIP timers (seconds) for pjsip's transactions.

    pjsua2 has no setting for them; the wheel exports ``pjsip_tsx_set_timers`` (ms; the
    last value is the 64*T1 give-up time, which also bounds Timer D). They matter beyond
    retransmissions: a transaction keeps its transport until it ends, and a challenged
    re-INVITE stays COMPLETED for Timer D (32 s by default), so after many quick moves
    the old sockets would fill pjlib's ioqueue (64 handles).
    """
    lib = ctypes.CDLL(_pjsua2_library())
    lib.pjsip_tsx_set_timers.argtypes = [ctypes.c_uint] * 4
    lib.pjsip_tsx_set_timers.restype = ctypes.c_int
    ms = [max(1, round(v * 1000)) for v in (t1, t2, t4, 64 * t1)]
    lib.pjsip_tsx_set_timers(*ms)


def _pjsua2_library() -> str:
    import pjsua2._pjsua2 as native  # the extension module PJSIP is linked into

    return str(native.__file__)


def body_of(message: str) -> str:
    _head, sep, body = message.partition("\r\n\r\n")
    return body if sep else ""


def contact_hostports(message: str) -> list[tuple[str, str]]:
    """(uri, host:port) of each Contact of a REGISTER response (bare ``<uri>`` forms)."""
    out: list[tuple[str, str]] = []
    head = message.partition("\r\n\r\n")[0]
    for line in head.split("\r\n")[1:]:
        name, sep, value = line.partition(":")
        if not sep or name.strip().lower() not in ("contact", "m"):
            continue
        for part in value.split(","):
            start, end = part.find("<"), part.find(">")
            uri = part[start + 1 : end] if 0 <= start < end else part.split(";")[0].strip()
            bare = uri.split(";")[0]
            hostport = bare.split("@", 1)[-1].removeprefix("sip:")
            out.append((bare, hostport))
    return out


@dataclass(slots=True)
class Pending:
    """The command waiting for pjsua (the daemon sends one at a time)."""

    id: int
    op: str
    sent: str = ""  # the INVITE body as it went on the wire (the key agreement binds it)
    extra: dict[str, Any] = field(default_factory=dict)


class Worker:
    """Owns the Endpoint; runs only in the thread that created it (pjsua2's rule)."""

    def __init__(self, settings: dict[str, Any]) -> None:
        self.s = settings
        self.ep = pj.Endpoint()
        self.pending: Pending | None = None
        self.acc: Account | None = None
        self.call: Call | None = None
        self.offer = ""  # the next offer, written into pjsua's SDP by onCallSdpCreated
        self.transports: list[int] = []  # open ones, the newest (in use) last
        self.hosts: dict[int, str] = {}  # the host each open transport is bound to
        self.host = str(settings["host"])
        self.local: tuple[str, int] = (self.host, 0)
        self.moved = False  # the next re-INVITE updates Contact and Via
        self.registered = False
        self.expires = 3600
        self.answered_at = 0.0  # time.monotonic() of our last answer
        self.own: set[str] = set()  # host:port of every contact we registered

    # ------------------------------------------------------------------ set-up

    def start(self) -> None:
        ep = self.ep
        ep.libCreate()
        cfg = pj.EpConfig()
        cfg.uaConfig.threadCnt = 0
        cfg.uaConfig.mainThreadOnly = True
        cfg.uaConfig.maxCalls = 4
        cfg.uaConfig.userAgent = "mdeci-agent (pjsua2)"
        cfg.logConfig.level = 0
        cfg.logConfig.consoleLevel = 0
        cfg.medConfig.noVad = True
        ep.libInit(cfg)
        set_timers(float(self.s["t1"]), float(self.s["t2"]), float(self.s["t4"]))
        ep.audDevManager().setNullDev()
        # A small SDP of pjsua's own (above 1,024 bytes wholeSdp reads back empty).
        for codec in ep.codecEnum2():
            ep.codecSetPriority(codec.codecId, 255 if codec.codecId.startswith("PCMU") else 0)
        tid = self._transport(self.host, int(self.s["port"]))
        ep.libStart()
        self.transports.append(tid)

    def _transport(self, host: str, port: int) -> int:
        """A transport bound to ``host``: a UDP socket, or a TCP or TLS listener (pjsip
        binds the connections it opens to the listener's address, so a move opens the
        next connection from the new one)."""
        tcfg = pj.TransportConfig()
        tcfg.boundAddress = host
        tcfg.publicAddress = host
        tcfg.port = port
        kind = self.s["transport"]
        if kind == "tls":
            # The broker's certificate must name the address we connect to, signed by
            # tls_ca (the system's CAs without it), as with the agent's own stack.
            tcfg.tlsConfig.CaListFile = self.s["tls_ca"]
            tcfg.tlsConfig.verifyServer = True
        type_ = {"udp": pj.PJSIP_TRANSPORT_UDP, "tcp": pj.PJSIP_TRANSPORT_TCP}.get(
            kind, pj.PJSIP_TRANSPORT_TLS
        )
        tid = int(self.ep.transportCreate(type_, tcfg))
        self.hosts[tid] = host
        self._use(tid)
        return tid

    def _use(self, tid: int) -> None:
        name = str(self.ep.transportGetInfo(tid).localName)
        addr, _, p = name.rpartition(":")
        self.local = (addr.strip("[]"), int(p))
        self.own.add(name)

    def _account_config(self, expires: int) -> Any:
        s = self.s
        acfg = pj.AccountConfig()
        acfg.idUri = s["aor"]
        acfg.regConfig.registrarUri = f"sip:{s['registrar']}"
        acfg.regConfig.registerOnAdd = False
        acfg.regConfig.timeoutSec = expires  # pjsua refreshes it before it runs out
        acfg.regConfig.retryIntervalSec = 0  # the daemon's core retries, with backoff
        acfg.regConfig.dropCallsOnFail = False
        acfg.regConfig.headers.append(_padding())
        acfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", s["user"], 0, s["password"]))
        acfg.sipConfig.transportId = self.transports[-1]
        if s["transport"] != "udp":
            # Over TCP/TLS pjsua would register the connection's ephemeral port, which
            # nobody can connect to and which we do not know as ours (a move then read
            # our own old binding as another device's: duplicate_aor). The listener's
            # address, as our stack registers.
            host, port = self.local
            where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
            acfg.sipConfig.contactForced = f"<sip:{s['user']}@{where};transport={s['transport']}>"
        acfg.mediaConfig.useLoopMedTp = True
        acfg.natConfig.sipOutboundUse = 0
        acfg.natConfig.contactRewriteUse = 0
        acfg.natConfig.viaRewriteUse = 0
        acfg.natConfig.sdpNatRewriteUse = 0
        acfg.callConfig.timerUse = pj.PJSUA_SIP_TIMER_INACTIVE
        return acfg

    # ------------------------------------------------------------------ replies

    def reply(self, pending: Pending, status: int | None, reason: str, **fields: Any) -> None:
        if self.pending is pending:
            self.pending = None
        self.answered_at = time.monotonic()
        emit(id=pending.id, status=status, reason=reason, local=list(self.local), **fields)

    # ------------------------------------------------------------------ commands

    def command(self, msg: dict[str, Any]) -> None:
        if self.pending is not None:
            # The daemon gave up waiting for it (its timeout); it answers nobody now.
            self.pending = None
        pending = Pending(int(msg["id"]), str(msg["op"]))
        self.pending = pending
        try:
            getattr(self, f"op_{pending.op}")(pending, msg)
        except pj.Error as exc:
            self.reply(pending, None, f"pjsua2: {exc.info()}")
        except Exception as exc:  # a command must always be answered
            self.reply(pending, None, f"pjsua2 worker: {exc!r}")

    def op_register(self, pending: Pending, msg: dict[str, Any]) -> None:
        expires = int(msg["expires"])
        if expires == 0:
            if self.acc is None or not self.registered:
                self.reply(pending, 200, "not registered")
                return
            self.acc.setRegistration(False)
            return
        self.expires = expires
        if self.acc is None:
            self.acc = Account(self)
            self.acc.create(self._account_config(expires))
        self.acc.setRegistration(True)

    def on_reg_state(self, code: int, reason: str, expiration: int, message: str) -> None:
        pending = self.pending
        # pjsua answers a challenge itself and reports only the final state.
        if pending is None or pending.op not in ("register", "move"):
            self.registered = self.registered and not (200 <= code < 300 and expiration == 0)
            return
        if pending.op == "move" and 200 <= code < 300 and expiration == 0:
            return  # the old contact's removal, should pjsua report it: not the answer
        self.registered = 200 <= code < 300 and expiration > 0
        others = [uri for uri, hp in contact_hostports(message) if hp not in self.own]
        if pending.op == "move":
            self.reply(pending, code, reason or "moved")
            return
        self.reply(pending, code, reason, contacts=others if expiration else [])

    def op_invite(self, pending: Pending, msg: dict[str, Any]) -> None:
        if self.acc is None:
            self.reply(pending, None, "not registered")
            return
        if self.call is not None and self.call.isActive():
            # A call the daemon stopped waiting for (its timeout), or gave up on (the
            # broker stopped answering: restarted): one dialog only. Its end answers
            # nothing: the pending INVITE is the new call's (on_disconnected).
            old, self.call = self.call, None
            old.replaced = True
            old.hangup(_bye_param())
        self.offer = str(msg["offer"])
        self.call = Call(self, self.acc)
        prm = pj.CallOpParam(True)
        # The placeholder and ours (audioCount 0 aborts): pjsua provisions one media slot
        # per count, and an offer with more lines than slots trips its assertion.
        prm.opt.audioCount = media_slots(self.offer)
        prm.opt.videoCount = 0
        # To: the broker's AOR; the request goes to its address.
        prm.txOption.targetUri = self.s["broker_target"]
        prm.txOption.headers.append(_padding())
        self.call.makeCall(self.s["broker_aor"], prm)

    def op_reinvite(self, pending: Pending, msg: dict[str, Any]) -> None:
        if self.call is None or not self.call.isActive():
            self.reply(pending, 481, "no dialog")
            return
        self.offer = str(msg["offer"])
        prm = pj.CallOpParam(True)
        prm.opt.audioCount = media_slots(self.offer)
        prm.opt.videoCount = 0
        if self.moved:
            prm.opt.flag = pj.PJSUA_CALL_UPDATE_CONTACT | pj.PJSUA_CALL_UPDATE_VIA
        prm.txOption.headers.append(_padding())
        self.call.reinvite(prm)

    def op_bye(self, pending: Pending, msg: dict[str, Any]) -> None:
        call = self.call
        if call is None or not call.isActive():
            self.reply(pending, 481, "no dialog")
            return
        pending.extra["call_id"] = call.call_id
        call.hangup(_bye_param())

    def op_move(self, pending: Pending, msg: dict[str, Any]) -> None:
        host = str(msg["host"])
        back = [tid for tid in self.transports if self.hosts.get(tid) == host]
        if back:
            # Back on an address we still hold a transport for (a device flapping
            # between networks): the same socket again. pjsua has eight transport
            # slots, and a closed transport keeps its slot until every transaction that
            # used it ended (up to 32 s): a new one per move ran out of them
            # (PJ_ETOOMANY), and then every move failed for good.
            tid = back[0]
            self.transports.remove(tid)
            self._use(tid)
        else:
            # Moves no re-INVITE completed (unregistered, or moving again before the
            # last one ended) would each leave one open.
            self._close_old_transports()
            tid = self._transport(host, 0)
        self.transports.append(tid)
        self.host = host
        self.moved = True
        if self.acc is None or not self.registered:
            self.reply(pending, 200, "moved")
            return
        # pjsua removes the old contact and registers the new one (docs/pjsip.md).
        self.acc.modify(self._account_config(self.expires))

    def on_invite_sent(self, body: str) -> None:
        if self.pending is not None and self.pending.op in ("invite", "reinvite"):
            self.pending.sent = body

    def on_invite_final(self, code: int, reason: str, message: str) -> None:
        pending = self.pending
        if pending is None or pending.op not in ("invite", "reinvite"):
            return
        if code in AUTH_CHALLENGES and not pending.extra.get("challenged"):
            pending.extra["challenged"] = True  # pjsua answers the challenge itself
            return
        call_id = self.call.call_id if self.call is not None else None
        if 200 <= code < 300:
            self.moved = False
            self._close_old_transports()
            self.reply(
                pending, code, reason, body=body_of(message), offer=pending.sent, call_id=call_id
            )
        else:
            self.reply(pending, code, reason, call_id=call_id)

    def on_disconnected(self, call: Call, code: int, reason: str) -> None:
        if call.replaced:
            # Hung up by op_invite for a new call: its BYE's "200 OK" once answered that
            # new INVITE (no Call-ID, no SDP), the core tried again, the retry hung up the
            # call the broker had just set up, and so on.
            return
        if self.call is call:
            self.call = None
        pending = self.pending
        if pending is not None and pending.op == "bye":
            self.reply(pending, 200, "bye sent")
        elif pending is not None and pending.op in ("invite", "reinvite"):
            self.reply(pending, code or None, reason or "call ended")
        elif call.confirmed:
            emit(event="bye", call_id=call.call_id)

    def _close_old_transports(self) -> None:
        # The dialog and the registration left the old sockets (reinvite with
        # UPDATE_CONTACT|UPDATE_VIA); close all but the KEEP_TRANSPORTS newest (a move
        # back to one of those addresses takes it again). One pjsua refuses to close
        # stays listed and is tried again at the next move or re-INVITE.
        kept: list[int] = []
        for tid in self.transports[:-KEEP_TRANSPORTS]:
            try:
                self.ep.transportClose(tid)
            except pj.Error:
                kept.append(tid)
            else:
                del self.hosts[tid]
        self.transports[:-KEEP_TRANSPORTS] = kept

    # ------------------------------------------------------------------ loop

    def run(self, inbox: queue.Queue[dict[str, Any] | None]) -> None:
        while True:
            busy = self.pending is not None or time.monotonic() - self.answered_at < BUSY_FOR
            self.ep.libHandleEvents(BUSY_POLL_MS if busy else IDLE_POLL_MS)
            while True:
                try:
                    msg = inbox.get_nowait()
                except queue.Empty:
                    break
                if msg is None:
                    # The daemon closed our stdin (or died): nothing to tidy for anyone.
                    _Out.stream.flush()
                    os._exit(0)
                self.command(msg)


def guarded(where: str, body: Callable[[], None]) -> None:
    try:
        body()
    except Exception as exc:  # SWIG swallows exceptions: report them ourselves
        emit(event="error", where=where, error=repr(exc))


class Account(pj.Account):  # type: ignore[misc]
    def __init__(self, worker: Worker) -> None:
        super().__init__()
        self.worker = worker

    def onRegState(self, prm: pj.OnRegStateParam) -> None:
        def go() -> None:
            message = str(prm.rdata.wholeMsg) if prm.rdata is not None else ""
            _Out.received += bool(message)
            self.worker.on_reg_state(int(prm.code), str(prm.reason), int(prm.expiration), message)

        guarded("onRegState", go)

    def onIncomingCall(self, prm: pj.OnIncomingCallParam) -> None:
        # The broker never calls us: refuse anything that does.
        def go() -> None:
            call = pj.Call(self, prm.callId)
            op = pj.CallOpParam()
            op.statusCode = 488
            call.hangup(op)

        guarded("onIncomingCall", go)


class Call(pj.Call):  # type: ignore[misc]
    def __init__(self, worker: Worker, acc: Account) -> None:
        super().__init__(acc)
        self.worker = worker
        self.call_id = ""
        self.confirmed = False
        self.replaced = False  # hung up by op_invite for a new call

    def onCallSdpCreated(self, prm: pj.OnCallSdpCreatedParam) -> None:
        def go() -> None:
            prm.sdp.wholeSdp = with_placeholder(self.worker.offer)

        guarded("onCallSdpCreated", go)

    def onCallState(self, prm: pj.OnCallStateParam) -> None:
        def go() -> None:
            info = self.getInfo()
            self.call_id = str(info.callIdString)
            if info.state == pj.PJSIP_INV_STATE_CONFIRMED:
                self.confirmed = True
            elif info.state == pj.PJSIP_INV_STATE_DISCONNECTED:
                self.worker.on_disconnected(self, int(info.lastStatusCode), str(info.lastReason))

        guarded("onCallState", go)

    def onCallTsxState(self, prm: pj.OnCallTsxStateParam) -> None:
        def go() -> None:
            e = prm.e.body.tsxState
            tsx = e.tsx
            if e.type == pj.PJSIP_EVENT_RX_MSG:
                _Out.received += 1
            if tsx.method != "INVITE" or tsx.role != pj.PJSIP_ROLE_UAC:
                return
            if e.type == pj.PJSIP_EVENT_TX_MSG and tsx.state == pj.PJSIP_TSX_STATE_CALLING:
                self.worker.on_invite_sent(body_of(str(e.src.tdata.wholeMsg)))
            elif tsx.statusCode >= 200 and tsx.state in (
                pj.PJSIP_TSX_STATE_COMPLETED,
                pj.PJSIP_TSX_STATE_TERMINATED,
            ):
                if e.prevState == pj.PJSIP_TSX_STATE_COMPLETED:
                    return  # the same final answer, on the way out
                message = str(e.src.rdata.wholeMsg) if e.type == pj.PJSIP_EVENT_RX_MSG else ""
                self.worker.on_invite_final(int(tsx.statusCode), str(tsx.statusText), message)

        guarded("onCallTsxState", go)


def main() -> int:
    keep_stdout_for_us()
    settings = json.loads(sys.stdin.readline())
    inbox: queue.Queue[dict[str, Any] | None] = queue.Queue()

    def read() -> None:
        for line in sys.stdin:
            if line.strip():
                try:
                    inbox.put(json.loads(line))
                except ValueError as exc:
                    emit(event="error", where="stdin", error=repr(exc))
        inbox.put(None)

    worker = Worker(settings)
    try:
        worker.start()
    except pj.Error as exc:
        emit(event="failed", reason=f"pjsua2: {exc.info()}")
        return 1
    emit(event="ready", local=list(worker.local))
    threading.Thread(target=read, name="stdin", daemon=True).start()
    worker.run(inbox)
    return 0


if __name__ == "__main__":
    sys.exit(main())
