"""``mdeci broker``: run the broker (SIP endpoint, registrar, queues, delivery).

Loads the config once, brings the database to the Alembic head (as ``mdeci db upgrade``
does), starts everything with :func:`mdeci.broker.app.run_broker`, prints one line
``broker listening sip=HOST:PORT media=HOST:PORT [tls=HOST:PORT] [metrics=HOST:PORT]``
once the sockets are bound, and runs until SIGINT or SIGTERM. Errors are one line and exit
status 2 (``mdeci.cli``).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
from pathlib import Path

from mdeci import oplog
from mdeci.broker import app as broker_app
from mdeci.broker.endpoint import Address, addr_text
from mdeci.commands import Command
from mdeci.commands.common import check_url, start_logging
from mdeci.config import BrokerConfig, HostPort, load_broker_config
from mdeci.errors import ConfigError
from sip.tools.common import stop_on_signals


def _listen(text: str) -> Address:
    try:
        hp = HostPort.parse(text) if not text.endswith(":0") else None
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    if hp is not None:
        return (hp.host, hp.port)
    host = text[:-2].strip("[]")  # port 0: any free port (HostPort wants 1..65535)
    if not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return (host, 0)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, required=True, help="broker TOML file (configs/broker.toml)"
    )
    parser.add_argument(
        "--listen-sip", type=_listen, metavar="HOST:PORT", help="override [sip] host and port"
    )
    parser.add_argument(
        "--listen-media",
        type=_listen,
        metavar="HOST:PORT",
        help="override [media] host and port (RUDP; 0 picks a free port)",
    )
    oplog.add_arguments(parser)


# The cyclic collector's youngest generation, collected every this many net new objects.
GC_YOUNG = 10_000


def collect_less_often() -> None:
    """The broker process's collector thresholds (``gc.set_threshold``).

    The youngest generation is collected every GC_YOUNG net new objects, not every
    700: a round of notifications (rows, frames, in-flight state) then dies young
    instead of being promoted, and full collections, which walk every object of every
    session (~100,000 with 100 sessions: 50 ms of CPU), come far less often (with the
    default threshold one lands in nearly every fan-out of 5,000 notifications, ~10 µs
    each; the drain and publish phases have none either way). Garbage without cycles is
    freed at once; at most GC_YOUNG more objects wait for a collection.
    """
    gc.set_threshold(GC_YOUNG, 20, 20)


async def serve(
    config: BrokerConfig, sip_listen: Address | None, media_listen: Address | None
) -> int:
    """Run until SIGINT/SIGTERM; 0 after a clean shutdown."""
    collect_less_often()
    # Imported as a module: mdeci.cli would take a 'run_broker' attribute for run().
    running = await broker_app.run_broker(config, sip_listen=sip_listen, media_listen=media_listen)
    stop = stop_on_signals()
    try:
        tls = running.endpoint.ua.tls_addr
        metrics = f" metrics={addr_text(running.metrics_addr)}" if running.metrics_addr else ""
        print(
            f"broker listening sip={addr_text(running.sip_addr)} "
            f"media={addr_text(running.media_addr)}"
            + (f" tls={addr_text(tls)}" if tls is not None else "")
            + metrics,
            flush=True,
        )
        oplog.event(
            "broker_started",
            node=config.node,
            sip=addr_text(running.sip_addr),
            media=addr_text(running.media_addr),
            tls=addr_text(tls) if tls is not None else None,
            metrics=addr_text(running.metrics_addr) if running.metrics_addr else None,
            store=running.store.engine.url.render_as_string(hide_password=True),
        )
        await stop.wait()
        oplog.event("broker_stopping", node=config.node)
    finally:
        await running.close()
    return 0


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.MdeciError` subclasses (one line, exit 2)."""
    config = load_broker_config(args.config)
    check_url(config.store.url)
    start_logging(args)
    return asyncio.run(serve(config, args.listen_sip, args.listen_media))


COMMANDS = {"broker": Command("broker", add_arguments, run)}
