"""Kannel's ``fakesmsc`` as a phone: MT it prints become :class:`Sms`, MO in its syntax.

fakesmsc (Debian ``kannel-extras``, ``/usr/lib/kannel/test/fakesmsc``) connects to
bearerbox's ``smsc = fake`` listener, submits the MO messages given on its command
line, and logs each MT as ``Got message N: <from to udh %XX.. data %XX..>``. The agent's
SMS inbox in interop tests reads those lines (see tests/sms/test_kannel.py).
"""

from __future__ import annotations

import re
from urllib.parse import quote_from_bytes, unquote_to_bytes

from mdeci.sms.codec import Sms
from mdeci.sms.errors import PduError

_LINE = re.compile(r"Got message \d+: <(.*)>\s*$")


def parse_mt_line(line: str) -> Sms | None:
    """The MT in one line of fakesmsc's output, ``None`` for other lines.

    Raises :class:`PduError` for a "Got message" line it cannot read.
    """
    match = _LINE.search(line)
    if match is None:
        return None
    tokens = match.group(1).split(" ")
    if len(tokens) < 4:
        raise PduError(f"short fakesmsc message: {line!r}")
    sender, recipient, kind = tokens[0], tokens[1], tokens[2]
    udh = b""
    rest = tokens[3:]
    if kind == "udh":
        udh, rest = unquote_to_bytes(rest[0]), rest[1:]
        if rest and rest[0] in ("data", "text"):
            rest = rest[1:]
    body = unquote_to_bytes(" ".join(rest).replace("+", "%20"))
    return Sms(sender, recipient, udh, body)


def mo_argument(sms: Sms) -> str:
    """fakesmsc's command-line form of an MO: ``from to udh <udh> <body>``."""
    if sms.udh:
        udh = quote_from_bytes(sms.udh, safe="")
        return f"{sms.sender} {sms.recipient} udh {udh} {quote_from_bytes(sms.body, safe='')}"
    return f"{sms.sender} {sms.recipient} data {quote_from_bytes(sms.body, safe='')}"
