"""``mdeci analytics``: the Spark jobs of :mod:`analytics.cli` (which, being a lower layer,
does not know :class:`~mdeci.commands.Command`)."""

from __future__ import annotations

import argparse

from mdeci.commands import Command


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    from analytics.cli import add_arguments

    add_arguments(parser)


def _run(args: argparse.Namespace) -> int:
    from analytics.cli import run

    return run(args)


COMMANDS = {"analytics": Command("analytics", _add_arguments, _run)}
