"""``mdeci calendar``: send the device's calendar of networks through the local agent:
weekly rules (what agent.toml's ``[calendar]`` holds) and dated ones ("Wi-Fi in ten
minutes, for two hours"). It replaces the ``[calendar]`` for the agent's life."""

from __future__ import annotations

import argparse
import time

from mdeci.agent.errors import ApiError
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


_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def _duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds."""
    scale = _UNITS.get(text[-1:], 0)
    number = text[:-1] if scale else text
    scale = scale or 1
    try:
        value = float(number) * scale
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a duration (e.g. 90s, 10m, 2h)"
        ) from None
    if not 0 <= value < 366 * 86400:
        raise argparse.ArgumentTypeError(f"duration {text!r} out of range")
    return value


def _expect(text: str) -> dict[str, object]:
    """``CHANNEL:P:IN[:FOR]``, e.g. ``wifi:1:10m:2h``: ``CHANNEL`` with probability ``P``
    from ``IN`` from now, for ``FOR`` (default 1h), as a dated rule."""
    parts = text.split(":")
    if not 3 <= len(parts) <= 4 or not parts[0]:
        raise argparse.ArgumentTypeError(f"expected CHANNEL:P:IN[:FOR], got {text!r}")
    rule = _rule(":".join(parts[:2]))
    start = time.time() + _duration(parts[2])
    span = _duration(parts[3]) if len(parts) == 4 else 3600.0
    if span <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: FOR must be above 0")
    rule["start_at"], rule["end_at"] = start, start + span
    return rule


def add_calendar_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = (
        "exit status: 0 kept by the broker, 3 the agent is disconnected (nothing sent), "
        "2 error. Later rules override earlier ones for their hours; dated ones override "
        "weekly ones."
    )
    parser.add_argument(
        "--rule",
        type=_rule,
        action="append",
        default=[],
        metavar="CHANNEL:P[:DAYS[:START-END]]",
        help="a network kind (or sms) there with probability P, e.g. wifi:0.9:mon-fri:8-19; "
        "repeatable",
    )
    parser.add_argument(
        "--expect",
        type=_expect,
        action="append",
        default=[],
        metavar="CHANNEL:P:IN[:FOR]",
        help="a network kind there with probability P from IN from now for FOR (default "
        "1h), e.g. wifi:1:10m:2h; repeatable",
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
    rules = [*args.rule, *args.expect]
    if not rules:
        raise ApiError("give at least one --rule or --expect")
    request = {"op": "calendar", "rules": rules, "utc_offset_minutes": args.utc_offset}
    try:
        answer = _call(args, request)
    except Disconnected:
        return _disconnected("calendar")
    _print(f"calendar kept: {answer.get('rules')} rules")
    return 0


COMMANDS = {"calendar": Command("calendar", add_calendar_arguments, run_calendar)}
