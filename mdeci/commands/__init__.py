"""One module per ``mdeci`` subcommand family; see :data:`mdeci.cli.REGISTRY`.

Each module exports ``COMMANDS``: a mapping of command name to :class:`Command`. The CLI
imports only the module of the command being run, so a client command does not pay for
the broker's imports.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Command:
    """One ``mdeci`` subcommand: how it reads its arguments and what it runs."""

    name: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
