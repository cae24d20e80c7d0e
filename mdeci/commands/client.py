"""Commands that talk to the local agent over its API socket (``docs/agent.md``).

``mdeci sub``, ``unsub``, ``subs``, ``pub``, ``tail``, ``status``, ``move``. Each finds the agent
by ``--socket PATH`` or by the ``api_socket`` of ``--config FILE`` (default
``configs/agent.toml``). Errors are one line and exit 2 (through :mod:`mdeci.cli`).

Exit codes besides 0 and 2 (docs/agent.md "Exit codes"): ``pub`` exits 3 when the agent
keeps the publish to send later (buffered, or sent with no answer yet) and 4 when the
broker refused it; ``sub`` (and ``unsub``) exit 3 when the agent is disconnected and
nothing was done; ``status`` exits 1 when not CONNECTED.
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
from mdeci.errors import MdeciError

EXIT_LATER = 3  # pub: kept by the agent, not yet accepted; sub: disconnected, not done
EXIT_REFUSED = 4  # the broker refused the request


class Disconnected(ApiError):
    """The agent has no session with the broker now (the API's ``not_connected``)."""


class Refused(ApiError):
    """The broker refused the request (the API's ``refused``, with its ``code``)."""


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
        message = str(answer.get("error", "the agent refused the request"))
        kind = answer.get("kind")
        if kind == "not_connected":
            raise Disconnected(message)
        if kind == "refused":
            raise Refused(message)
        raise ApiError(message)
    return answer


def _when(epoch: object) -> str:
    if not isinstance(epoch, int | float):
        return "-"
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _print(text: str) -> None:
    sys.stdout.write(text + "\n")


# ------------------------------------------------------------------ sub


def add_sub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = "exit status: 0 subscribed, 3 the agent is disconnected (nothing done), 2 error"
    parser.add_argument("subject", help="subject pattern, e.g. stocks.* or news.#")
    parser.add_argument("--filter", default="", help="e.g. \"(Stock == 'PETR4') and (Price < 25)\"")
    parser.add_argument("--ttl", type=int, help="seconds (default: the broker's)")
    parser.add_argument(
        "--fixed",
        action="store_true",
        help="end at the TTL (default: the agent renews it until mdeci unsub)",
    )
    parser.add_argument(
        "--class",
        dest="qclass",
        default="",
        metavar="CLASS",
        help="queue class of its notifications (the broker's [channels] classes, e.g. "
        "urgent, normal, bulk: bulk may wait for a cheaper network; default: the broker's)",
    )
    parser.add_argument(
        "--in-order",
        action="store_true",
        help="its notifications keep their order: a later one never overtakes one held "
        'for a cheaper network (docs/channels.md "The order")',
    )
    parser.add_argument(
        "--no-type-check",
        action="store_true",
        help="subscribe even if the filter compares an attribute with a value of another "
        "kind than in the notifications the agent kept",
    )
    parser.add_argument(
        "--wait",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="if the agent is disconnected, retry for up to SECONDS (default 0: exit 3)",
    )
    _common(parser)


def _disconnected(command: str) -> int:
    print(
        f"mdeci {command}: the agent is not connected to the broker: nothing done "
        "(retry later; `mdeci status` shows why)",
        file=sys.stderr,
    )
    return EXIT_LATER


def _kept(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The notifications the agent keeps (its inbox), read up to the live marker."""
    path = _socket(args)
    kept: list[dict[str, Any]] = []
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
            sock.sendall(b'{"op":"tail","from":0}\n')
            with sock.makefile("rb") as stream:
                for line in stream:
                    obj = json.loads(line)
                    if not isinstance(obj, dict) or "notify" not in obj:
                        break  # the live marker (or an error): the kept ones are read
                    kept.append(obj["notify"])
        except (OSError, ValueError):
            return kept  # the check is advisory; the subscribe reports a dead agent
    return kept


def check_filter_types(args: argparse.Namespace) -> None:
    """Refuse a filter that compares an attribute with a value of another kind than the
    attribute had in the kept notifications of the subject. Raises
    :class:`~mdeci.filter_types.FilterTypeError` (a bad filter: FilterError, left to the broker)."""
    from mdeci.errors import FilterError, SubjectError
    from mdeci.filter_types import check_types, kinds_seen
    from mdeci.filters import parse_filter
    from mdeci.subjects import subject_matches

    try:
        expr = parse_filter(args.filter)
    except FilterError:
        return  # the broker says where it does not parse
    samples = []
    for record in _kept(args):
        attrs = record.get("attrs")
        try:
            matches = subject_matches(args.subject, str(record.get("subject", "")))
        except SubjectError:
            return
        if matches and isinstance(attrs, dict):
            samples.append(attrs)
    check_types(expr, kinds_seen(samples))


def run_sub(args: argparse.Namespace) -> int:
    """Exit 0 subscribed, 3 disconnected (nothing done), 2 error or refusal."""
    import time

    if args.filter and not args.no_type_check:
        try:
            check_filter_types(args)
        except MdeciError as exc:
            raise ApiError(
                f"filter type error: {exc} (--no-type-check to subscribe anyway)"
            ) from None

    request = {
        "op": "sub",
        "subject": args.subject,
        "filter": args.filter,
        "ttl": args.ttl,
        "lease": not args.fixed,
        "qclass": args.qclass,
        "in_order": args.in_order,
    }
    deadline = time.monotonic() + max(args.wait, 0.0)
    while True:
        try:
            answer = _call(args, request)
            break
        except Disconnected:
            if time.monotonic() >= deadline:
                return _disconnected("sub")
            time.sleep(0.2)
    until = _when(answer.get("expires_at"))
    if answer.get("lease", False):
        print(f"subscribed {answer['sub_id']} (renewed by the agent; broker expiry {until})")
    else:
        print(f"subscribed {answer['sub_id']} until {until} (fixed)")
    return 0


# ------------------------------------------------------------------ unsub


def add_unsub_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("sub_id", help="the id that mdeci sub or mdeci subs printed")
    _common(parser)


def run_unsub(args: argparse.Namespace) -> int:
    try:
        _call(args, {"op": "unsub", "sub_id": args.sub_id})
    except Disconnected:
        return _disconnected("unsub")
    print(f"unsubscribed {args.sub_id}")
    return 0


# ------------------------------------------------------------------ subs


def add_subs_arguments(parser: argparse.ArgumentParser) -> None:
    _common(parser)


def run_subs(args: argparse.Namespace) -> int:
    answer = _call(args, {"op": "subs"})
    title = "subscriptions" + (" (cached: agent disconnected)" if answer.get("stale") else "")
    rows = [["sub_id", "subject", "filter", "expires", "lease", "state"]]
    for item in answer.get("items", []):
        state = str(item.get("state", "live"))
        if item.get("reason"):
            state += f": {item['reason']}"
        rows.append(
            [
                str(item["sub_id"]),
                str(item["subject"]),
                str(item["filter"]),
                _when(item.get("expires_at")),
                "renewed" if item.get("lease") else "fixed",
                state,
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
    # A script tells an accepted publish from one the agent only keeps by the status alone.
    parser.epilog = (
        "exit status: 0 published (the broker accepted it), 3 sent or buffered (the agent "
        "keeps it and sends it until the broker answers) or held (for a cheaper network), "
        "4 refused by the broker, 2 error"
    )
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
    parser.add_argument(
        "--class",
        dest="qclass",
        default="",
        metavar="CLASS",
        help="queue class (e.g. urgent, normal, bulk: a bulk publish made on a costly "
        "network waits for a cheaper one within its delay; default: the subscription's)",
    )
    _common(parser)


def run_pub(args: argparse.Namespace) -> int:
    """Exit 0 accepted by the broker, 3 kept by the agent (buffered or sent without an
    answer yet: it goes out until the broker accepts it), 4 refused, 2 error."""
    request = {
        "op": "pub",
        "subject": args.subject,
        "attrs": dict(args.attr),
        "text": args.payload,
        "urgent": args.urgent,
        "qclass": args.qclass,
    }
    try:
        answer = _call(args, request)
    except Refused as exc:
        print(f"mdeci pub: refused: {exc}", file=sys.stderr)
        return EXIT_REFUSED
    if answer.get("state") == "published":
        print(f"published {answer['msg_id']} matched={answer.get('matched')}")
        return 0
    if answer.get("state") == "held":
        print(f"held {answer['msg_id']} (waits for a cheaper network, at most its class's delay)")
    elif answer.get("state") == "sent":
        print(f"sent {answer['msg_id']} (no answer from the broker yet; kept until it comes)")
    else:
        print(f"buffered {answer['msg_id']} (sent when the agent reconnects)")
    return EXIT_LATER


# ------------------------------------------------------------------ tail


def add_tail_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--count", type=int, help="stop after N notifications")
    parser.add_argument(
        "--from", dest="from_nseq", type=int, help="first replay kept notifications from nseq"
    )
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--json", action="store_true", help="JSON lines (the default when not on a terminal)"
    )
    form.add_argument(
        "--text", action="store_true", help="readable lines (the default on a terminal)"
    )
    _common(parser)


def _value(value: object) -> str:
    return (
        json.dumps(value)
        if isinstance(value, str) and (" " in value or not value)
        else (str(value).lower() if isinstance(value, bool) else str(value))
    )


def readable(record: dict[str, Any]) -> str:
    """A notification as one line: ``#NSEQ TIME SUBJECT NAME=VALUE... "text"``."""
    import base64
    import binascii

    attrs = record.get("attrs") or {}
    words = [
        f"#{record.get('nseq')}",
        _when(record.get("published_at")),
        str(record.get("subject", "")),
        *(f"{k}={_value(v)}" for k, v in sorted(attrs.items())),
    ]
    text = record.get("text")
    if isinstance(text, str):
        words.append(json.dumps(text, ensure_ascii=False))
    else:
        try:
            size = len(base64.b64decode(str(record.get("payload") or "")))
        except (binascii.Error, ValueError):
            size = 0
        words.append(f"<{size} bytes>")
    if record.get("missed"):
        words.append(f"(missed {record['missed']} before this one)")
    return " ".join(words)


def readable_event(event: dict[str, Any]) -> str:
    """An event of the stream as one line, e.g. ``subscription 7 ended: TTL reached``."""
    sub = event.get("subscription")
    if isinstance(sub, dict):
        what = "ended" if sub.get("replaces") is None else f"replaces {sub['replaces']}"
        return (
            f"subscription {sub.get('sub_id')} {sub.get('subject', '')} {what}: "
            f"{sub.get('reason', '')}"
        )
    if "store_replaced" in event:
        return (
            f"broker store replaced ({event['store_replaced']}): "
            f"{event.get('restored', 0)} subscription(s) sent again"
        )
    return json.dumps(event, separators=(",", ":"))


def run_tail(args: argparse.Namespace) -> int:
    import asyncio  # tail streams: the async client (other commands do without asyncio)

    from mdeci.agent.api import ApiClient

    as_json = args.json or (not args.text and not sys.stdout.isatty())

    async def go() -> None:
        seen = 0
        async with ApiClient(_socket(args)) as client:
            async for record in client.tail(args.from_nseq, events=True):
                event = record.get("event")
                if as_json:
                    print(json.dumps(record, separators=(",", ":")), flush=True)
                elif isinstance(event, dict):
                    print(readable_event(event), flush=True)
                else:
                    print(readable(record), flush=True)
                if event is None:  # --count counts notifications
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
