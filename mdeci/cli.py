"""The ``mdeci`` command line. Errors are one line on stderr and a non-zero exit.

Theory of operation
-------------------
:data:`REGISTRY` lists every subcommand explicitly: its name, the module that implements
it and its help line. The module exports ``COMMANDS`` (name -> :class:`Command`); a
registered module that is missing, or that does not export the command, is an error
(``tests/mdeci/test_cli.py`` loads every entry). To keep client commands fast, only the
module of the command being run is imported; the others appear in ``mdeci --help`` with
their help line alone.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import import_module

from mdeci.commands import Command
from mdeci.errors import MdeciError


@dataclass(frozen=True, slots=True)
class Entry:
    """A registered subcommand: where its :class:`Command` lives, and its help line."""

    module: str
    help: str


REGISTRY: dict[str, Entry] = {
    "broker": Entry("mdeci.commands.broker", "run the broker (SIP endpoint, queues, delivery)"),
    "agent": Entry("mdeci.commands.agent", "run the device agent daemon"),
    "sub": Entry("mdeci.commands.client", "subscribe through the local agent"),
    "unsub": Entry("mdeci.commands.client", "cancel a subscription through the local agent"),
    "subs": Entry("mdeci.commands.client", "list subscriptions through the local agent"),
    "pub": Entry("mdeci.commands.client", "publish through the local agent"),
    "tail": Entry("mdeci.commands.client", "print notifications as the local agent receives them"),
    "status": Entry("mdeci.commands.client", "show the local agent's session status"),
    "move": Entry("mdeci.commands.client", "move the local agent to another local address"),
    "calendar": Entry("mdeci.commands.calendar", "send the device's calendar of networks"),
    "db": Entry("mdeci.commands.db", "database administration (upgrade)"),
    "admin": Entry("mdeci.commands.admin", "users, sessions, kicks and drain (operators)"),
    "check": Entry("mdeci.commands.check", "validate a broker or agent config file and exit"),
    "sms": Entry("mdeci.commands.sms", "SMS and channel spend per user (operators)"),
    "demo": Entry("mdeci.commands.demo", "run the whole story on this machine"),
    "analytics": Entry(
        "mdeci.commands.analytics", "Spark jobs over churn logs (generate, churn, report)"
    ),
    "init": Entry("mdeci.commands.init", "write the sample configs and units into a folder"),
    "completion": Entry("mdeci.commands.completion", "print a shell completion script"),
}


class RegistryError(RuntimeError):
    """A registered command's module does not export it (a packaging or programming bug)."""


def load(name: str) -> Command:
    """The :class:`Command` registered as ``name``; imports its module.

    Raises ModuleNotFoundError when the module is missing, :class:`RegistryError` when it
    does not export ``name`` in its ``COMMANDS``.
    """
    entry = REGISTRY[name]
    module = import_module(entry.module)
    commands = getattr(module, "COMMANDS", None)
    command = commands.get(name) if isinstance(commands, dict) else None
    if not isinstance(command, Command) or command.name != name:
        raise RegistryError(f"{entry.module} does not export the command {name!r} in COMMANDS")
    return command


def version() -> str:
    """The installed distribution's version (the package's own when not installed)."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as dist_version

    try:
        return dist_version("mdeci")
    except PackageNotFoundError:  # pragma: no cover - running from a bare source tree
        from mdeci import __version__

        return __version__


class _Version(argparse.Action):
    """``--version``, read from the installed metadata only when asked (start-up time)."""

    def __call__(self, parser: argparse.ArgumentParser, *_: object, **__: object) -> None:
        print(f"mdeci {version()}")
        parser.exit()


_ROLE = re.compile(r":[a-z]+:`~?([^`]+)`")


def plain(text: str) -> str:
    """``text`` without reStructuredText markup (roles, double back-quotes, ``**``): help
    output is read on a terminal, not rendered."""
    text = _ROLE.sub(lambda m: m.group(1).rsplit(".", 1)[-1], text)
    return text.replace("``", "").replace("**", "")


def _chosen(argv: Sequence[str]) -> str | None:
    """The subcommand named on the command line (the top level takes no option values)."""
    for arg in argv:
        if not arg.startswith("-"):
            return arg
    return None


def build_parser(argv: Sequence[str]) -> tuple[argparse.ArgumentParser, Command | None]:
    """The parser, with the full arguments of the command ``argv`` names (if any)."""
    parser = argparse.ArgumentParser(prog="mdeci", description=plain(__doc__.splitlines()[0]))
    parser.add_argument("--version", action=_Version, nargs=0, help="print the version and exit")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    chosen = _chosen(argv)
    command: Command | None = None
    for name, entry in REGISTRY.items():
        p = sub.add_parser(name, help=entry.help, description=entry.help)
        if name == chosen:
            command = load(name)
            command.add_arguments(p)
    return parser, command


_OWN = frozenset({"mdeci", "sip", "rudp", "analytics"})


def _not_installed(exc: ModuleNotFoundError, name: str | None) -> int:
    """One line for a dependency this interpreter lacks (mdeci run by a Python outside
    its environment, such as the system's); a module of mdeci's own that is missing is a
    packaging bug, and is raised again."""
    if (exc.name or "").split(".")[0] in _OWN:
        raise exc
    print(
        f"mdeci{f' {name}' if name else ''}: error: module {exc.name!r} is not installed for "
        f"{sys.executable}; run mdeci from the environment it is installed in "
        "(.venv/bin/mdeci after make demo)",
        file=sys.stderr,
    )
    return 2


def main(argv: Sequence[str] | None = None) -> int:
    args_list = list(sys.argv[1:] if argv is None else argv)
    try:
        parser, command = build_parser(args_list)
    except ModuleNotFoundError as exc:
        return _not_installed(exc, _chosen(args_list))
    args = parser.parse_args(args_list)
    assert command is not None  # parse_args exits unless a registered command was named
    try:
        return command.run(args)
    except MdeciError as exc:
        print(f"mdeci {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:
        return _not_installed(exc, args.command)
    except KeyboardInterrupt:
        return 130
