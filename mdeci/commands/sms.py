"""``mdeci sms spend``: per-user SMS (and other channel) spend, for operators.

Reads the channel usage counters the broker keeps in its database (the same counters
the selector's limits use) for one calendar month, UTC.
"""

from __future__ import annotations

import argparse
import datetime as dt
import re

from rich.console import Console
from rich.table import Table

from mdeci.commands import Command
from mdeci.commands.common import add_store_source, store_url
from mdeci.errors import ConfigError
from mdeci.store.usage import spend_report


def _month(text: str) -> tuple[dt.date, dt.date]:
    m = re.fullmatch(r"(\d{4})-(\d{2})", text)
    if m is None or not 1 <= int(m.group(2)) <= 12:
        raise argparse.ArgumentTypeError(f"expected YYYY-MM, got {text!r}")
    first = dt.date(int(m.group(1)), int(m.group(2)), 1)
    end = dt.date(first.year + first.month // 12, first.month % 12 + 1, 1)
    return first, end


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="sms_command", metavar="ACTION", required=True)
    spend = sub.add_parser(
        "spend", help="per-user spend for a month", description="per-user spend for a month"
    )
    add_store_source(spend)
    spend.add_argument("--user", help="only this user's AOR, e.g. sip:alice@example.org")
    spend.add_argument("--month", type=_month, help="YYYY-MM (default: the current month, UTC)")


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.ConfigError` or :class:`~mdeci.errors.StoreError`."""
    if args.sms_command != "spend":  # pragma: no cover - argparse allows only 'spend'
        raise ConfigError(f"unknown sms action {args.sms_command!r}")
    url = store_url(args)
    if args.month is not None:
        first, end = args.month
    else:
        today = dt.datetime.now(dt.UTC).date()
        first, end = _month(f"{today.year:04d}-{today.month:02d}")
    rows = spend_report(url, first, end, user=args.user)
    table = Table(title=f"channel spend {first:%Y-%m}")
    for column in ("user", "channel", "messages", "bytes", "money"):
        table.add_column(column, justify="left" if column in ("user", "channel") else "right")
    for row in rows:
        table.add_row(row.user, row.channel, str(row.messages), str(row.bytes), f"{row.money:.4f}")
    Console().print(table if rows else f"no channel usage recorded in {first:%Y-%m}")
    return 0


COMMANDS = {"sms": Command("sms", add_arguments, run)}
