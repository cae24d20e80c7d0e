"""Helpers shared by the tools: address parsing and a clean asyncio main."""

from __future__ import annotations

import argparse
import asyncio
import signal


def hostport(text: str) -> tuple[str, int]:
    """``host:port`` or ``[v6]:port`` for argparse; a bad value is a one-line error."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    value = int(port)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"port out of range in {text!r}")
    return host.strip("[]"), value


def stop_on_signals() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM (a tool's or a daemon's clean shutdown)."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop
