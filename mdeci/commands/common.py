"""Pieces several commands share: the stop signals of a daemon, the store's URL."""

from __future__ import annotations

import argparse
import asyncio
import signal
from pathlib import Path

from mdeci.config import load_broker_config
from mdeci.errors import ConfigError


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (a daemon's clean shutdown)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


def add_store_source(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (the broker's) or ``--url URL``: which database to open."""
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--config", type=Path, help="broker TOML file (its [store] url is used)")
    source.add_argument("--url", help="database URL, e.g. sqlite:///var/broker.db")


def store_url(args: argparse.Namespace, *, make_data_dir: bool = False) -> str:
    """The database URL :func:`add_store_source` asked for.

    ``make_data_dir`` creates the broker's data folder (a fresh checkout has none).
    Raises :class:`ConfigError` (bad config, folder not creatable).
    """
    if args.url is not None:
        return str(args.url)
    config = load_broker_config(args.config)
    if make_data_dir:
        try:
            config.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"cannot create data_dir {config.data_dir}: {exc.strerror}") from None
    return config.store.url
