"""Commands that talk to the local agent over its API socket (``docs/agent.md``).

``mdeci sub``, ``unsub``, ``subs``, ``pub``, ``tail``, ``status``, ``move``. Each finds the agent
by ``--socket PATH`` or by the ``api_socket`` of ``--config FILE`` (default
``configs/agent.toml``). Errors are one line and exit 2 (through :mod:`mdeci.cli`).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mdeci.agent.errors import ApiError
from mdeci.commands import Command
from mdeci.commands.text import table
from mdeci.config import load_agent_config


def _common(parser: argparse.ArgumentParser) -> None:
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--socket", type=Path, help="the agent's API socket")
    where.add_argument(
        "--config",
        type=Path,
        help="agent TOML file whose api_socket to use (default configs/agent.toml)",
    )


def _socket(args: argparse.Namespace) -> Path:
    if args.socket is not None:
        return Path(args.socket)
    return load_agent_config(args.config or Path("configs/agent.toml")).api_socket


def _call(args: argparse.Namespace, request: dict[str, Any]) -> dict[str, Any]:
    """One request to the agent's API and its answer, the protocol of
    :class:`mdeci.agent.api.ApiClient` (a JSON object per line) spoken synchronously:
    importing asyncio would cost a client command a good part of its start-up budget."""
    path = _socket(args)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            raise ApiError(f"cannot reach the agent at {path}: is `mdeci agent` running?") from None
        try:
            sock.sendall((json.dumps(request) + "\n").encode())
            with sock.makefile("rb") as stream:
                line = stream.readline()
        except OSError as exc:
            raise ApiError(f"agent connection failed: {exc}") from None
    if not line:
        raise ApiError("the agent closed the connection")
    try:
        answer = json.loads(line)
    except ValueError as exc:
        raise ApiError(f"agent connection failed: {exc}") from None
    if not isinstance(answer, dict):
        raise ApiError("the agent answered something that is not a JSON object")
    if not answer.get("ok"):
        raise ApiError(str(answer.get("error", "the agent refused the request")))
    return answer


def _when(epoch: object) -> str:
    if not isinstance(epoch, int | float):
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")


# ------------------------------------------------------------------ sub


def add_sub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subject", help="subject pattern, e.g. stocks.* or news.#")
    parser.add_argument("--filter", default="", help="e.g. \"(Stock == 'PETR4') and (Price < 25)\"")
    parser.add_argument("--ttl", type=int, help="seconds (default: the broker's)")
    _common(parser)


def run_sub(args: argparse.Namespace) -> int:
    answer = _call(
        args, {"op": "sub", "subject": args.subject, "filter": args.filter, "ttl": args.ttl}
    )
    print(f"subscribed {answer['sub_id']} until {_when(answer.get('expires_at'))}")
    return 0


# ------------------------------------------------------------------ unsub


def add_unsub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sub_id", help="the id `mdeci sub` or `mdeci subs` printed")
    _common(parser)


def run_unsub(args: argparse.Namespace) -> int:
    _call(args, {"op": "unsub", "sub_id": args.sub_id})
    print(f"unsubscribed {args.sub_id}")
    return 0


# ------------------------------------------------------------------ subs


def add_subs_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)


def run_subs(args: argparse.Namespace) -> int:
    answer = _call(args, {"op": "subs"})
    title = "subscriptions" + (" (cached: agent disconnected)" if answer.get("stale") else "")
    rows = [["sub_id", "subject", "filter", "expires"]]
    for item in answer.get("items", []):
        rows.append(
            [
                str(item["sub_id"]),
                str(item["subject"]),
                str(item["filter"]),
                _when(item.get("expires_at")),
            ]
        )
    _print(table(rows, title=title))
    return 0


# ------------------------------------------------------------------ pub


def _attr(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    # Numbers and booleans as JSON reads them; anything else is text.
    try:
        parsed = json.loads(value)
    except ValueError:
        parsed = value
    if not isinstance(parsed, int | float | bool | str):
        parsed = value
    return name, parsed


def add_pub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("subject", help="dot-separated words, e.g. stocks.petr4")
    parser.add_argument(
        "--attr",
        type=_attr,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an attribute (numbers and true/false are typed); repeatable",
    )
    parser.add_argument("--payload", default=None, help="payload text (UTF-8)")
    parser.add_argument("--urgent", action="store_true", help="may go by SMS when offline")
    _common(parser)


def run_pub(args: argparse.Namespace) -> int:
    answer = _call(
        args,
        {
            "op": "pub",
            "subject": args.subject,
            "attrs": dict(args.attr),
            "text": args.payload,
            "urgent": args.urgent,
        },
    )
    if answer.get("state") == "published":
        print(f"published {answer['msg_id']} matched={answer.get('matched')}")
    elif answer.get("state") == "sent":
        print(f"sent {answer['msg_id']} (no answer from the broker yet; kept until it comes)")
    else:
        print(f"buffered {answer['msg_id']} (sent when the agent reconnects)")
    return 0


# ------------------------------------------------------------------ tail


def add_tail_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, help="stop after N notifications")
    parser.add_argument(
        "--from", dest="from_nseq", type=int, help="first replay kept notifications from nseq"
    )
    _common(parser)


def run_tail(args: argparse.Namespace) -> int:
    import asyncio  # tail streams: the async client (other commands do without asyncio)

    from mdeci.agent.api import ApiClient

    async def go() -> None:
        seen = 0
        async with ApiClient(_socket(args)) as client:
            async for record in client.tail(args.from_nseq):
                print(json.dumps(record, separators=(",", ":")), flush=True)
                seen += 1
                if args.count is not None and seen >= args.count:
                    return

    if args.count is not None and args.count <= 0:
        raise ApiError("--count must be > 0")
    asyncio.run(go())
    return 0


# ------------------------------------------------------------------ status


def add_status_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print the raw JSON")
    _common(parser)


def run_status(args: argparse.Namespace) -> int:
    """Exit 0 when CONNECTED, 1 otherwise (scripts and health checks rely on it)."""
    status = _call(args, {"op": "status"})["status"]
    code = 0 if status.get("status") == "CONNECTED" else 1
    if args.json:
        print(json.dumps(status))
        return code
    rows = []
    for key in (
        "status",
        "state",
        "node",
        "sip_addr",
        "media_addr",
        "broker_media_addr",
        "call_id",
        "registered",
        "highest_nseq",
        "buffered",
        "inbox",
        "listeners",
        "subscriptions",
        "store_id",
        "sip_stack",
        "sip_transport",
        "sip_contact",
        "sip_received",
        "attempts",
        "failed_attempts",
        "alerts",
        "last_error",
    ):
        value = status.get(key)
        if isinstance(value, dict):
            value = ", ".join(f"{k}={v}" for k, v in sorted(value.items())) or None
        rows.append([key, "-" if value is None else str(value)])
    _print(table(rows, title=f"agent {status['aor']}"))
    return code


# ------------------------------------------------------------------ move


def add_move_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("address", help="a local address to move to, e.g. 127.0.0.3")
    _common(parser)


def run_move(args: argparse.Namespace) -> int:
    answer = _call(args, {"op": "move", "address": args.address})
    _print(f"moved to {answer['sip_addr']} (media {answer['media_addr']})")
    return 0


COMMANDS = {
    "sub": Command("sub", add_sub_arguments, run_sub),
    "unsub": Command("unsub", add_unsub_arguments, run_unsub),
    "subs": Command("subs", add_subs_arguments, run_subs),
    "pub": Command("pub", add_pub_arguments, run_pub),
    "tail": Command("tail", add_tail_arguments, run_tail),
    "status": Command("status", add_status_arguments, run_status),
    "move": Command("move", add_move_arguments, run_move),
}
