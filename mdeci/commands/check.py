"""``mdeci check --config FILE``: validate a broker or agent config and exit (as
``kamailio -c`` does).

Loads the file exactly as the daemon would (same reader, same checks, ``password_env``
read from the environment, the users file included) and prints ``FILE: ok (broker)`` or
one error line (exit 2). Nothing is bound, created or written. The kind is the one given
by ``--kind``, else ``agent`` when the file has a top-level ``aor`` key, else ``broker``.
"""

from __future__ import annotations

import argparse
import tomllib
from pathlib import Path

from mdeci.commands import Command
from mdeci.commands.common import check_url
from mdeci.config import load_agent_config, load_broker_config


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, required=True, help="broker or agent TOML file")
    parser.add_argument(
        "--kind", choices=("auto", "broker", "agent"), default="auto", help="default: auto"
    )


def _kind(path: Path) -> str:
    try:
        with path.open("rb") as fh:
            return "agent" if "aor" in tomllib.load(fh) else "broker"
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError):
        return "broker"  # the loader reports the exact problem


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.ConfigError` (one line, exit 2)."""
    path: Path = args.config
    kind = _kind(path) if args.kind == "auto" else args.kind
    if kind == "agent":
        load_agent_config(path)
    else:
        # The SIP endpoint's settings are checked too (an external registrar needs the
        # broker's own credentials), as the broker does at start.
        from mdeci.broker.app import endpoint_config

        config = load_broker_config(path)
        check_url(config.store.url)
        endpoint_config(config)
    print(f"{path}: ok ({kind})")
    return 0


COMMANDS = {"check": Command("check", add_arguments, run)}
