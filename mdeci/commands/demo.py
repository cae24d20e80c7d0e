"""``mdeci demo``: the whole story on one machine, then a summary.

A broker on a fresh SQLite file, alice's phone (moving 127.0.0.2 -> .3 -> .4, silent
for a while, back on .5) subscribed to ``StockExchange`` where
``(Stock == 'PETR4') and (Price < 25)``, and bob publishing quotes meanwhile. Exit status
0 when every matching quote reached alice exactly once and in order, 1 otherwise.
See :mod:`mdeci.demo.story`.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from mdeci.commands import Command
from mdeci.demo import story
from mdeci.demo.plan import FULL, QUICK
from mdeci.demo.summary import render
from mdeci.demo.view import make_view

DEFAULT_OUT = Path("out/demo")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick", action="store_true", help="a shorter run (~15 s instead of ~35 s)"
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=DEFAULT_OUT,
        help=f"working folder, wiped at start (default {DEFAULT_OUT}); logs in OUT/logs",
    )
    view = parser.add_mutually_exclusive_group()
    view.add_argument(
        "--live",
        dest="live",
        action="store_true",
        default=None,
        help="rich live panel even when stdout is not a terminal",
    )
    view.add_argument(
        "--plain", dest="live", action="store_false", help="plain progress lines even on a terminal"
    )


def run(args: argparse.Namespace) -> int:
    """0 if nothing was lost, duplicated or reordered; 1 otherwise.

    Raises :class:`~mdeci.errors.MdeciError` when the demo cannot run (one line, exit 2).
    """
    plan = QUICK if args.quick else FULL
    view = make_view(sys.stdout, live=args.live)
    summary = asyncio.run(story.play(plan, args.out, view))
    print("\n".join(render(summary)), flush=True)
    print(f"churn logs for `mdeci analytics churn`: {summary.logs}", flush=True)
    return 0 if summary.ok else 1


COMMANDS = {"demo": Command("demo", add_arguments, run)}
