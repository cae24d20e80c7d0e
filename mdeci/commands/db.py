"""``mdeci db upgrade``: bring the broker's database to the newest schema (Alembic).

A thin command: the URL comes from ``--url`` or the broker config's ``[store] url``; the
migration itself runs in :mod:`mdeci.store.migrate`, the only place that speaks SQL.
"""

from __future__ import annotations

import argparse

from mdeci.commands import Command
from mdeci.commands.common import add_store_source, store_url
from mdeci.errors import ConfigError
from mdeci.store.migrate import upgrade


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser(
        "upgrade", help="apply every pending migration", description="apply every migration"
    )
    add_store_source(up)


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.ConfigError` or :class:`~mdeci.errors.StoreError`."""
    if args.db_command != "upgrade":  # pragma: no cover - argparse allows only 'upgrade'
        raise ConfigError(f"unknown db action {args.db_command!r}")
    revision = upgrade(store_url(args, make_data_dir=True))
    print(f"database at revision {revision}")
    return 0


COMMANDS = {"db": Command("db", add_arguments, run)}
