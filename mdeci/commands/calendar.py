"""``mdeci calendar``: send the device's weekly calendar of networks through the local
agent (what agent.toml's ``[calendar]`` sends at every session start, for a change in
between)."""

from __future__ import annotations

import argparse

from mdeci.commands import Command
from mdeci.commands.client import Disconnected as Disconnected
from mdeci.commands.client import _call, _common, _disconnected, _print

_DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")


def _days(text: str) -> int:
    """``mon-fri``, ``sat,sun``, ``0-4`` -> the frame's weekday bits (bit 0 Monday)."""
    bits = 0
    for part in text.split(","):
        lo, _, hi = part.partition("-")
        first, last = _day(lo), _day(hi or lo)
        if last < first:
            raise argparse.ArgumentTypeError(f"days {part!r} run backwards")
        for d in range(first, last + 1):
            bits |= 1 << d
    return bits


def _day(text: str) -> int:
    text = text.strip().lower()
    if text in _DAYS:
        return _DAYS.index(text)
    if text.isdigit() and int(text) <= 6:
        return int(text)
    raise argparse.ArgumentTypeError(f"{text!r} is not a day (mon..sun or 0..6)")


def _rule(text: str) -> dict[str, object]:
    """``CHANNEL:P[:DAYS[:START-END]]``, e.g. ``wifi:0.9:mon-fri:8-19``."""
    parts = text.split(":")
    if not 2 <= len(parts) <= 4 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected CHANNEL:P[:DAYS[:START-END]], got {text!r}")
    try:
        p = float(parts[1])
    except ValueError:
        raise argparse.ArgumentTypeError(f"probability {parts[1]!r} is not a number") from None
    rule: dict[str, object] = {"channel": parts[0], "p": p}
    if len(parts) >= 3:
        rule["weekdays"] = _days(parts[2])
    if len(parts) == 4:
        start, sep, end = parts[3].partition("-")
        if not (sep and start.isdigit() and end.isdigit()):
            raise argparse.ArgumentTypeError(f"hours {parts[3]!r}: expected START-END, e.g. 8-19")
        rule["start_hour"], rule["end_hour"] = int(start), int(end)
    return rule


def add_calendar_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 kept by the broker, 3 the agent is disconnected (nothing sent), "
        "2 error. Later rules override earlier ones for their hours."
    )
    parser.add_argument(
        "--rule",
        type=_rule,
        action="append",
        required=True,
        metavar="CHANNEL:P[:DAYS[:START-END]]",
        help="a network kind (or sms) there with probability P, e.g. wifi:0.9:mon-fri:8-19; "
        "repeatable",
    )
    parser.add_argument(
        "--utc-offset",
        type=int,
        default=0,
        metavar="MINUTES",
        help="the device's local time, minutes east of UTC (default 0)",
    )
    _common(parser)


def run_calendar(args: argparse.Namespace) -> int:
    request = {"op": "calendar", "rules": args.rule, "utc_offset_minutes": args.utc_offset}
    try:
        answer = _call(args, request)
    except Disconnected:
        return _disconnected("calendar")
    _print(f"calendar kept: {answer.get('rules')} rules")
    return 0


COMMANDS = {"calendar": Command("calendar", add_calendar_arguments, run_calendar)}
