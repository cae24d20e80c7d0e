"""``python -m sip bindings``: ask a registrar which contacts an AOR has (RFC 3261
§10.2.3, a REGISTER without Contact), one line per contact. Operators use it to check
Kamailio's location table after agents register or move (docs/operations.md §9)."""

from __future__ import annotations

import argparse

from sip.aio.ua import UaConfig, UserAgent
from sip.errors import SipError, SipParseError
from sip.message import Response
from sip.tools.common import hostport
from sip.transaction import TimerConfig
from sip.uri import NameAddr, SipUri, parse_uri


def contacts_of(response: Response) -> list[str]:
    """The contact URIs of a REGISTER response (several per header line allowed)."""
    out: list[str] = []
    for value in response.headers.get_all("Contact"):
        try:
            out.append(str(NameAddr.parse(value).uri))
        except SipParseError:
            continue
    return out


async def fetch(registrar: tuple[str, int], aor: str, transport: str = "udp") -> list[str]:
    """The contacts ``registrar`` holds for ``aor``. Raises SipError on a refusal."""
    uri = parse_uri(aor)
    if not isinstance(uri, SipUri) or uri.user is None:
        raise SipError(f"not a sip:user@domain AOR: {aor!r}")
    ua = UserAgent(UaConfig(aor=aor, timers=TimerConfig(t1=0.1), tcp=transport == "tcp"))
    await ua.start("127.0.0.1" if ":" not in registrar[0] else "::1")
    try:
        request = ua.build_request(
            "REGISTER", f"sip:{uri.host}", to=f"<{aor}>", transport=transport
        )
        request.headers.remove("Contact")
        response = await ua.request(request, registrar, transport)
        if response.status >= 300:
            raise SipError(f"{response.status} {response.reason}")
        return contacts_of(response)
    finally:
        await ua.close()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--registrar", type=hostport, required=True, help="HOST:PORT")
    parser.add_argument("--aor", required=True, action="append", help="sip:user@domain")
    parser.add_argument("--transport", choices=("udp", "tcp"), default="udp")


async def serve(args: argparse.Namespace) -> int:
    status = 0
    for aor in args.aor:
        try:
            contacts = await fetch(args.registrar, aor, args.transport)
        except SipError as exc:
            print(f"{aor} error {exc}", flush=True)
            status = 1
            continue
        print(f"{aor} {len(contacts)} " + " ".join(contacts), flush=True)
    return status
