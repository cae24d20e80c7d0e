"""The ``mdeci`` command line. Errors are one line on stderr and a non-zero exit.

Each subcommand registers itself through :data:`COMMANDS`, so that the broker, agent,
analytics and database commands live in their own modules and this one only dispatches.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from importlib import import_module

from mdeci.errors import MdeciError

# name -> (module, help). The module defines ``add_arguments(parser)`` and ``run(args) -> int``.
COMMANDS: dict[str, tuple[str, str]] = {
    "broker": ("mdeci.commands.broker", "run the broker (SIP endpoint, queues, delivery)"),
    "agent": ("mdeci.commands.agent", "run the device agent daemon"),
    "sub": ("mdeci.commands.client", "subscribe through the local agent"),
    "unsub": ("mdeci.commands.client", "cancel a subscription through the local agent"),
    "subs": ("mdeci.commands.client", "list subscriptions through the local agent"),
    "pub": ("mdeci.commands.client", "publish through the local agent"),
    "tail": ("mdeci.commands.client", "print notifications as the local agent receives them"),
    "status": ("mdeci.commands.client", "show the local agent's session status"),
    "db": ("mdeci.commands.db", "database administration (upgrade)"),
    "sms": ("mdeci.commands.sms", "SMS and channel spend per user (operators)"),
    "demo": ("mdeci.commands.demo", "run the whole story on this machine"),
    "analytics": ("analytics.cli", "Spark jobs over churn logs (generate, churn, report)"),
}


def _build_parser() -> tuple[argparse.ArgumentParser, dict[str, Callable[..., int]]]:
    parser = argparse.ArgumentParser(prog="mdeci", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    runners: dict[str, Callable[..., int]] = {}
    for name, (module_name, help_text) in COMMANDS.items():
        try:
            module = import_module(module_name)
        except ModuleNotFoundError as exc:
            if exc.name is None or not module_name.startswith(exc.name):
                raise
            continue  # the command's module is not built yet
        p = sub.add_parser(name, help=help_text, description=help_text)
        add = getattr(module, f"add_{name}_arguments", None) or module.add_arguments
        add(p)
        runners[name] = getattr(module, f"run_{name}", None) or module.run
    return parser, runners


def main(argv: Sequence[str] | None = None) -> int:
    parser, runners = _build_parser()
    args = parser.parse_args(argv)
    try:
        return runners[args.command](args)
    except MdeciError as exc:
        print(f"mdeci {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
