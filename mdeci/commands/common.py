"""Pieces several commands share: the store's URL, the log set-up."""

from __future__ import annotations

import argparse
from pathlib import Path

from mdeci import oplog
from mdeci.config import load_broker_config
from mdeci.errors import ConfigError


def start_logging(args: argparse.Namespace) -> None:
    """Set up the operations log from ``--log-*``; raises :class:`ConfigError`."""
    try:
        oplog.setup_from_args(args)
    except OSError as exc:
        raise ConfigError(f"cannot open --log-file {args.log_file}: {exc.strerror}") from None


def add_store_source(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (the broker's) or ``--url URL``: which database to open."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="broker TOML file (its [store] url is used)")
    source.add_argument("--url", help="database URL, e.g. sqlite:///var/broker.db")


def check_url(url: str) -> str:
    """``url``, or a :class:`ConfigError` with the spelling to use for a PostgreSQL URL
    SQLAlchemy cannot open: ``postgres://`` names no dialect, and ``postgresql://`` picks
    psycopg2, which mdeci does not install (its driver is psycopg 3)."""
    from importlib.util import find_spec

    scheme = url.partition("://")[0]
    if scheme == "postgres" or (scheme == "postgresql" and find_spec("psycopg2") is None):
        raise ConfigError(
            f"database URL scheme '{scheme}://' cannot be opened: write "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DATABASE (the psycopg 3 driver)"
        )
    return url


def store_url(args: argparse.Namespace, *, make_data_dir: bool = False) -> str:
    """The database URL :func:`add_store_source` asked for.

    ``make_data_dir`` creates the broker's data folder (a fresh checkout has none).
    The users' ``password_env`` variables are not read: these commands open the store and
    authenticate nobody, so an operator runs them without the service's secrets.
    Raises :class:`ConfigError` (bad config, folder not creatable).
    """
    if args.url is not None:
        return check_url(str(args.url))
    config = load_broker_config(args.config, secrets=False)
    if make_data_dir:
        try:
            config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create data_dir {config.data_dir}: {exc.strerror}") from None
    return check_url(config.store.url)
