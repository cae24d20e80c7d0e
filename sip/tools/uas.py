"""``python -m sip uas``: answers INVITEs that carry our SDP, accepts re-INVITE and BYE,
and prints one line per dialog event (flushed, so a test or a person can follow it)."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import secrets

from sip.aio.ua import (
    DialogConfirmed,
    DialogEnded,
    DialogEvent,
    DialogRefreshed,
    DialogStarted,
    IncomingRequest,
    Reply,
    UaConfig,
    UserAgent,
)
from sip.errors import SdpError
from sip.sdp import build_answer, parse_session
from sip.tools.common import hostport, stop_on_signals


def describe(event: DialogEvent) -> str:
    """One line for a dialog event."""
    d = event.dialog
    name = {
        DialogStarted: "started",
        DialogConfirmed: "confirmed",
        DialogRefreshed: "refreshed",
        DialogEnded: "ended",
    }[type(event)]
    line = f"{name} call-id={d.call_id} remote={d.remote_uri} target={d.remote_target}"
    if isinstance(event, DialogRefreshed | DialogStarted):
        with contextlib.suppress(SdpError):
            body = event.body if isinstance(event, DialogRefreshed) else b""
            if body:
                media = parse_session(body)
                line += f" media={media.addr}:{media.port} version={media.version}"
    if isinstance(event, DialogEnded):
        line += f" reason={event.reason!r}"
    return line


class Answerer:
    """Answers offers with our SDP (RFC 3264) on a fixed media port; 488 if unusable."""

    def __init__(self, user: str, addr: str, media_port: int, delay: float = 0.0) -> None:
        self.user, self.addr, self.media_port = user, addr, media_port
        self.delay = delay
        self.sess_id = secrets.randbelow(2**31)
        self.version = 0

    async def __call__(self, req: IncomingRequest) -> Reply:
        request = req.request
        if request.method != "INVITE":
            return Reply(405)  # the UA core answers OPTIONS, BYE, CANCEL itself
        if self.delay:
            # An answer that takes time (a user deciding, a slow store): CANCEL can reach it.
            await asyncio.sleep(self.delay)
        try:
            offer = parse_session(request.body)
            self.version += 1
            answer = build_answer(
                request.body, self.user, self.sess_id, self.version, self.addr, self.media_port
            )
        except SdpError as exc:
            warning = f'399 mdeci "{exc.reason}"'.replace("\r", " ").replace("\n", " ")
            return Reply(488, headers=(("Warning", warning[:200]),))
        print(
            f"offer call-id={request.call_id} media={offer.addr}:{offer.port} "
            f"version={offer.version}",
            flush=True,
        )
        return Reply(200, body=answer.encode())


async def serve(args: argparse.Namespace) -> int:
    host, port = args.listen
    answerer = Answerer(args.user, host, args.media_port, args.answer_delay)
    ua = UserAgent(UaConfig(aor=f"sip:{args.user}@{args.domain}"), answerer)
    bound = await ua.start(host, port)
    print(f"uas listening on {bound[0]}:{bound[1]} (udp, tcp)", flush=True)
    stop = stop_on_signals()
    stopper = asyncio.create_task(stop.wait())
    try:
        while not stop.is_set():
            getter = asyncio.create_task(ua.events.get())
            done, _ = await asyncio.wait({getter, stopper}, return_when=asyncio.FIRST_COMPLETED)
            if getter in done:
                print(describe(getter.result()), flush=True)
            else:
                getter.cancel()
    finally:
        await ua.close()
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--listen", type=hostport, default=("127.0.0.1", 5080))
    parser.add_argument("--domain", default="example.org")
    parser.add_argument("--user", default="broker", help="our user part (default broker)")
    parser.add_argument("--media-port", type=int, default=40000, help="RUDP port to answer")
    parser.add_argument(
        "--answer-delay",
        type=float,
        default=0.0,
        help="seconds to wait before answering an INVITE (default 0)",
    )
