"""``mdeci db upgrade``: bring the broker's database to the newest schema (Alembic).

A thin command: the URL comes from ``--url`` or the broker config's ``[store] url``; the
migration itself runs in :mod:`mdeci.store.migrate`, the only place that speaks SQL.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from mdeci.config import load_broker_config
from mdeci.errors import ConfigError
from mdeci.store.migrate import upgrade


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="db_command", metavar="ACTION", required=True)
    up = sub.add_parser(
        "upgrade", help="apply every pending migration", description="apply every migration"
    )
    source = up.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="broker TOML file (its [store] url is used)")
    source.add_argument("--url", help="database URL, e.g. sqlite:///var/broker.db")


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.ConfigError` or :class:`~mdeci.errors.StoreError`."""
    if args.db_command != "upgrade":  # pragma: no cover - argparse allows only 'upgrade'
        raise ConfigError(f"unknown db action {args.db_command!r}")
    if args.url is not None:
        url: str = args.url
    else:
        config = load_broker_config(args.config)
        try:
            # The data folder is the broker's own; a fresh checkout has none yet.
            config.data_dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create data_dir {config.data_dir}: {exc.strerror}") from None
        url = config.store.url
    revision = upgrade(url)
    print(f"database at revision {revision}")
    return 0
