"""A PJSIP (pjsua2) device, run in its own process by test_pjsua.py.

pjsua2 aborts the whole process on misuse, so it never runs inside pytest. It prints one
JSON object per line on stdout for every step; the test reads them. The recipe
(docs/pjsip.md): one owner thread, polling ``libHandleEvents``; an inactive placeholder
audio line before our application line, written in ``onCallSdpCreated``.

usage: pjsua_peer.py REGISTRAR_HOST:PORT UAS_HOST:PORT USER PASSWORD DOMAIN NEW_HOST
       [PROXY_HOST:PORT [TRANSPORT [CA CERT KEY]]]

TRANSPORT is udp (default), tcp or tls; with tls, CA verifies the proxy's certificate and
CERT/KEY are the device's own (its TLS listener, which a proxy connects to).
"""

from __future__ import annotations

import gc
import json
import sys
import time
from collections.abc import Callable

import pjsua2 as pj

KEY = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8"


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


class Account(pj.Account):  # type: ignore[misc]
    def __init__(self) -> None:
        super().__init__()
        self.reg_codes: list[int] = []

    def onRegState(self, prm: pj.OnRegStateParam) -> None:
        try:
            self.reg_codes.append(int(prm.code))
            emit(event="reg_state", code=int(prm.code), expiration=int(prm.expiration))
        except Exception as exc:  # SWIG swallows exceptions: report them ourselves
            emit(event="error", where="onRegState", error=repr(exc))


class Call(pj.Call):  # type: ignore[misc]
    def __init__(self, acc: Account, host: Callable[[], str]) -> None:
        super().__init__(acc)
        self.host = host
        self.version = 1
        self.states: list[str] = []
        self.remote_sdps: list[str] = []

    def onCallSdpCreated(self, prm: pj.OnCallSdpCreatedParam) -> None:
        try:
            addr = self.host()
            sdp = (
                "v=0\r\n"
                f"o=pjsua 1 {self.version} IN IP4 {addr}\r\n"
                "s=mdeci\r\n"
                f"c=IN IP4 {addr}\r\n"
                "t=0 0\r\n"
                "m=audio 4000 RTP/AVP 0\r\n"
                "a=rtpmap:0 PCMU/8000\r\n"
                "a=inactive\r\n"
                f"m=application {43000 + self.version} UDP/MDECI-RUDP mdeci\r\n"
                "a=mdeci-version:2\r\n"
                f"a=mdeci-kx:{KEY}\r\n"
                "a=sendrecv\r\n"
            )
            self.version += 1
            prm.sdp.wholeSdp = sdp
        except Exception as exc:
            emit(event="error", where="onCallSdpCreated", error=repr(exc))

    def onCallState(self, prm: pj.OnCallStateParam) -> None:
        try:
            info = self.getInfo()
            self.states.append(info.stateText)
            emit(event="call_state", state=info.stateText, code=int(info.lastStatusCode))
        except Exception as exc:
            emit(event="error", where="onCallState", error=repr(exc))

    def onCallTsxState(self, prm: pj.OnCallTsxStateParam) -> None:
        try:
            e = prm.e.body.tsxState
            tsx = e.tsx
            if tsx.method == "INVITE" and tsx.role == pj.PJSIP_ROLE_UAC and tsx.statusCode >= 200:
                body = e.src.rdata.wholeMsg if e.type == pj.PJSIP_EVENT_RX_MSG else ""
                emit(event="invite_final", code=int(tsx.statusCode))
                if "m=application" in body:
                    self.remote_sdps.append(body.split("\r\n\r\n", 1)[-1])
                    emit(event="answer", sdp=self.remote_sdps[-1])
        except Exception as exc:
            emit(event="error", where="onCallTsxState", error=repr(exc))


def main() -> int:
    registrar, uas, user, password, domain, new_host = sys.argv[1:7]
    # Optional 7th argument: an outbound proxy (Kamailio); the call then goes to
    # sip:broker@<domain> through it, as a device of a proxied domain calls.
    proxy = sys.argv[7] if len(sys.argv) > 7 else None
    transport = sys.argv[8] if len(sys.argv) > 8 else "udp"
    kind = {
        "udp": pj.PJSIP_TRANSPORT_UDP,
        "tcp": pj.PJSIP_TRANSPORT_TCP,
        "tls": pj.PJSIP_TRANSPORT_TLS,
    }[transport]
    param = "" if transport == "udp" else f";transport={transport}"

    def transport_config(host: str) -> pj.TransportConfig:
        tcfg = pj.TransportConfig()
        tcfg.boundAddress = host
        tcfg.publicAddress = host
        tcfg.port = 0
        if transport == "tls":
            ca, cert, key = sys.argv[9:12]
            tcfg.tlsConfig.CaListFile = ca
            tcfg.tlsConfig.certFile = cert
            tcfg.tlsConfig.privKeyFile = key
            tcfg.tlsConfig.verifyServer = True
            tcfg.tlsConfig.method = pj.PJSIP_TLSV1_2_METHOD
        return tcfg

    ep = pj.Endpoint()
    ep.libCreate()
    cfg = pj.EpConfig()
    cfg.uaConfig.threadCnt = 0
    cfg.uaConfig.mainThreadOnly = True
    cfg.logConfig.level = 1
    cfg.logConfig.consoleLevel = 1
    ep.libInit(cfg)
    ep.audDevManager().setNullDev()
    for codec in ep.codecEnum2():
        ep.codecSetPriority(codec.codecId, 255 if codec.codecId.startswith("PCMU") else 0)
    tid1 = ep.transportCreate(kind, transport_config("127.0.0.2"))
    ep.libStart()
    host = ["127.0.0.2"]

    def pump(seconds: float, until: Callable[[], bool] = lambda: False) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            ep.libHandleEvents(10)
            if until():
                return True
        return until()

    acfg = pj.AccountConfig()
    acfg.idUri = f"sip:{user}@{domain}"
    acfg.regConfig.registrarUri = f"sip:{registrar}{param}"
    acfg.regConfig.timeoutSec = 600
    acfg.sipConfig.authCreds.append(pj.AuthCredInfo("digest", "*", user, 0, password))
    acfg.sipConfig.transportId = tid1
    if proxy is not None:
        acfg.sipConfig.proxies.append(f"sip:{proxy}{param};lr")
    acfg.mediaConfig.useLoopMedTp = True
    acfg.natConfig.sipOutboundUse = 0
    acfg.natConfig.contactRewriteUse = 0
    acfg.natConfig.viaRewriteUse = 0
    acc = Account()
    acc.create(acfg)
    ok = pump(10, lambda: 200 in acc.reg_codes)
    emit(event="registered", ok=ok)
    if not ok:
        return 1

    call = Call(acc, lambda: host[0])
    prm = pj.CallOpParam(True)
    prm.opt.audioCount = 2
    prm.opt.videoCount = 0
    call.makeCall(f"sip:broker@{domain if proxy else uas}", prm)
    ok = pump(10, lambda: "CONFIRMED" in call.states)
    emit(event="confirmed", ok=ok)
    if not ok:
        return 1

    # Move: a transport on another loopback address, re-REGISTER there, re-INVITE.
    tid2 = ep.transportCreate(kind, transport_config(new_host))
    host[0] = new_host
    acfg.sipConfig.transportId = tid2
    acc.reg_codes.clear()
    acc.modify(acfg)
    pump(10, lambda: 200 in acc.reg_codes)
    emit(event="reregistered", ok=200 in acc.reg_codes)
    answers = len(call.remote_sdps)
    rprm = pj.CallOpParam(True)
    rprm.opt.audioCount = 2
    rprm.opt.flag = pj.PJSUA_CALL_UPDATE_CONTACT | pj.PJSUA_CALL_UPDATE_VIA
    call.reinvite(rprm)
    ok = pump(10, lambda: len(call.remote_sdps) > answers)
    emit(event="reinvited", ok=ok)

    ep.hangupAllCalls()
    pump(10, lambda: "DISCONNECTED" in call.states)
    emit(event="hungup", ok="DISCONNECTED" in call.states)
    acc.setRegistration(False)
    pump(2)
    acc.shutdown()
    # A Call or Account alive after libDestroy aborts at exit: drop ours first.
    call = None  # type: ignore[assignment]
    acc = None  # type: ignore[assignment]
    gc.collect()
    ep.libDestroy(pj.PJSUA_DESTROY_NO_RX_MSG)
    emit(event="done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
