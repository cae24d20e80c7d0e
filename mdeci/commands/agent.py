"""``mdeci agent --config configs/agent.toml``: run the device agent until SIGINT/SIGTERM.

(``run_agent`` must not be a name of this module: the CLI would take it for the runner.)

Prints ``agent <aor> api=<socket> sip=HOST:PORT`` once the API socket listens; on a
signal it sends BYE and unREGISTERs, then exits 0.
"""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from mdeci import oplog
from mdeci.agent import daemon
from mdeci.commands import Command
from mdeci.commands.common import start_logging
from mdeci.config import load_agent_config
from sip.tools.common import stop_on_signals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--config", type=Path, default=Path("configs/agent.toml"), help="agent TOML file"
    )
    oplog.add_arguments(parser)


async def _main(config_path: Path) -> int:
    config = load_agent_config(config_path)
    running = await daemon.run_agent(config)
    stop = stop_on_signals()
    try:
        sip_addr = running.status().sip_addr
        print(f"agent {config.aor} api={config.api_socket} sip={sip_addr}", flush=True)
        await stop.wait()
    finally:
        await running.close(clean=True)
    return 0


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.ConfigError`, :class:`~mdeci.agent.errors.AgentError`."""
    start_logging(args)
    try:
        return asyncio.run(_main(args.config))
    except OSError as exc:
        from mdeci.agent.errors import AgentError

        raise AgentError(f"cannot bind: {exc.strerror or exc}") from None


COMMANDS = {"agent": Command("agent", add_arguments, run)}
