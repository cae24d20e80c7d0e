"""``mdeci admin``: users, sessions and kicks for operators (``--config`` the broker's TOML).

- ``users add|del|passwd|list``: straight to the store (only HA1 is kept, never the
  password). Digest authentication reads the store at each request, so a user added here
  registers at once on a running broker; no restart. A password comes from
  ``--password-env VAR`` or standard input (one line; prompted without echo on a
  terminal), never from the command line, where ``ps`` would show it.
- ``sessions``: every stored session (URI, the broker node that owns it, state, media
  address, last change, queue depth, live subscriptions), from the store (so it works
  while the broker is down). When no broker answers on the config's ``admin_socket``, a
  line on standard error says so: the states are then those the broker stored when it
  last ran, and CONNECTED means "to be resumed at its next start", not "reachable now".
- ``queue USER``: what waits in a user's queue (nseq, subject, size, attributes), oldest
  first; payload bytes only with ``--payload``.
- ``kick URI``: the running broker ends the session (BYE) through its admin socket.
- ``drain``: the running broker goes out of service (a cluster behind Kamailio's
  dispatcher, docs/operations.md): 503 to new INVITEs and to the dispatcher's OPTIONS
  probes, and a BYE to every session it holds, so each agent INVITEs again and reaches
  another broker. Prints how many sessions it ended. Lasts until the broker stops.

None of them needs the service's secrets: the config's ``password_env`` variables may be
unset (only the broker itself authenticates with them). Errors are one line and exit 2.
"""

from __future__ import annotations

import argparse
import getpass
import json
import os
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from mdeci.commands import Command
from mdeci.commands.common import check_url
from mdeci.commands.text import table
from mdeci.config import USER_NAME, BrokerConfig, load_broker_config
from mdeci.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="admin_command", metavar="ACTION", required=True)

    def config(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--config", type=Path, required=True, help="the broker's TOML file")
        return p

    users = sub.add_parser("users", help="add, delete, re-password or list users")
    users_sub = users.add_subparsers(dest="users_command", metavar="ACTION", required=True)
    for name, help_text in (("add", "add a user"), ("passwd", "set a user's password")):
        p = config(users_sub.add_parser(name, help=help_text, description=help_text))
        p.add_argument("user", help="SIP user name (the AOR is sip:USER@<domain>)")
        p.add_argument("--password-env", metavar="VAR", help="read the password from $VAR")
    config(users_sub.add_parser("del", help="delete a user")).add_argument("user")
    config(users_sub.add_parser("list", help="list users")).add_argument(
        "--json", action="store_true", help="JSON lines"
    )
    sessions = config(sub.add_parser("sessions", help="stored sessions with queue depth"))
    sessions.add_argument("--json", action="store_true", help="JSON lines")
    queue = config(sub.add_parser("queue", help="what waits in a user's queue"))
    queue.add_argument("user", help="SIP user name or URI")
    queue.add_argument("--limit", type=int, default=50, help="oldest N (default 50)")
    queue.add_argument("--payload", action="store_true", help="show the payloads too")
    queue.add_argument("--json", action="store_true", help="JSON lines")
    kick = config(sub.add_parser("kick", help="end a user's session now (BYE)"))
    kick.add_argument("uri", help="e.g. sip:alice@example.org (or just the user name)")
    config(sub.add_parser("drain", help="take the running broker out of service (BYE to all)"))


def _password(args: argparse.Namespace) -> str:
    if args.password_env:
        value = os.environ.get(args.password_env)
        if not value:
            raise ConfigError(f"environment variable {args.password_env!r} is not set")
        return value
    if sys.stdin.isatty():
        first = getpass.getpass("password: ")
        if getpass.getpass("again: ") != first:
            raise ConfigError("the two passwords differ")
        value = first
    else:
        value = sys.stdin.readline().rstrip("\r\n")
    if not value:
        raise ConfigError("empty password")
    return value


def _uri(config: BrokerConfig, user: str) -> str:
    if user.startswith(("sip:", "sips:")):
        return user
    if not USER_NAME.fullmatch(user):
        raise ConfigError(f"{user!r} is not a SIP user name")
    return f"sip:{user}@{config.domain}"


def load_config(path: Path) -> BrokerConfig:
    """The broker's config without its secrets. Raises :class:`ConfigError`."""
    return load_broker_config(path, secrets=False)


def _store(config: BrokerConfig) -> Any:
    from mdeci.store.base import make_engine
    from mdeci.store.repo import BrokerStore

    return BrokerStore(make_engine(check_url(config.store.url)))


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _table(rows: list[list[str]]) -> None:
    print(table(rows))


def _users(args: argparse.Namespace, config: BrokerConfig) -> int:
    from mdeci.store.errors import StoreError

    store = _store(config)
    try:
        if args.users_command == "list":
            users = store.users.list_users()
            if args.json:
                for u in users:
                    print(json.dumps({"uri": u.uri, "username": u.username, "realm": u.realm}))
            elif users:
                _table(
                    [["uri", "username", "realm"]] + [[u.uri, u.username, u.realm] for u in users]
                )
            else:
                print("no users")
            return 0
        uri = _uri(config, args.user)
        if args.users_command == "del":
            if not store.users.remove_user(uri):
                raise ConfigError(f"no user {uri}")
            print(f"deleted {uri}")
            return 0
        password = _password(args)
        if args.users_command == "add":
            user = uri.split(":", 1)[1].split("@", 1)[0]
            store.users.add_user(uri, config.realm, password, username=user)
            print(f"added {uri} (realm {config.realm})")
        else:
            if not store.users.set_password(uri, password):
                raise ConfigError(f"no user {uri}")
            print(f"password of {uri} changed")
        return 0
    except StoreError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    finally:
        store.engine.dispose()


def _sessions(args: argparse.Namespace, config: BrokerConfig) -> int:
    from dataclasses import asdict

    from mdeci.broker.admin import broker_running
    from mdeci.store import ops
    from mdeci.store.errors import StoreError

    store = _store(config)
    try:
        rows = ops.sessions(store.engine, time.time())
    except StoreError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    finally:
        store.engine.dispose()
    if rows and not broker_running(config.admin_socket):
        print(
            f"mdeci admin sessions: no broker answers on {config.admin_socket}: these are "
            "the states stored when it last ran (CONNECTED: to be resumed at its start)",
            file=sys.stderr,
        )
    if args.json:
        for row in rows:
            print(json.dumps(asdict(row)))
        return 0
    if not rows:
        print("no sessions")
        return 0
    head = ["uri", "owner", "state", "address", "last seen", "queue", "subs"]
    body = [
        [
            r.uri,
            r.owner or "-",
            r.status,
            r.media_addr,
            _when(r.last_seen),
            str(r.queue_depth),
            str(r.subscriptions),
        ]
        for r in rows
    ]
    _table([head, *body])
    return 0


def _attrs(raw: bytes) -> dict[str, Any]:
    import cbor2

    try:
        attrs = cbor2.loads(raw)
    except (ValueError, cbor2.CBORDecodeError):
        return {}
    return attrs if isinstance(attrs, dict) else {}


def _queue(args: argparse.Namespace, config: BrokerConfig) -> int:
    import base64

    from mdeci.store.errors import StoreError
    from mdeci.store.waiting import queue_view

    if args.limit < 1:
        raise ConfigError("--limit must be at least 1")
    uri = _uri(config, args.user)
    store = _store(config)
    try:
        view = queue_view(store.engine, uri, limit=args.limit, payloads=args.payload)
    except StoreError as exc:
        raise ConfigError(str(exc).splitlines()[0]) from None
    finally:
        store.engine.dispose()
    if args.json:
        for w in view.items:
            item: dict[str, Any] = {
                "nseq": w.nseq,
                "msg_id": w.msg_id,
                "subject": w.subject,
                "publisher": w.publisher_uri,
                "published_at": w.published_at,
                "urgent": w.urgent,
                "qclass": w.qclass,
                "size": w.size,
                "attrs": _attrs(w.attrs_cbor),
            }
            if w.payload is not None:
                item["payload"] = base64.b64encode(w.payload).decode()
            print(json.dumps(item))
        return 0
    title = f"{uri}: {view.depth} waiting, last nseq {view.last_nseq}, missed {view.missed}"
    if not view.items:
        print(title)
        return 0
    head = ["nseq", "published", "subject", "from", "bytes", "attrs"]
    if args.payload:
        head.append("payload")
    body = []
    for w in view.items:
        attrs = " ".join(f"{k}={v}" for k, v in sorted(_attrs(w.attrs_cbor).items()))
        row = [str(w.nseq), _when(w.published_at), w.subject, w.publisher_uri, str(w.size)]
        row.append(attrs + (" urgent" if w.urgent else ""))
        if w.payload is not None:
            row.append(repr(w.payload.decode("utf-8", errors="replace"))[:60])
        body.append(row)
    print(table([head, *body], title=title))
    if view.depth > len(view.items):
        print(f"({view.depth - len(view.items)} more; --limit N)")
    return 0


def run(args: argparse.Namespace) -> int:
    """Raises :class:`~mdeci.errors.MdeciError` (one line, exit 2)."""
    config = load_config(args.config)
    if args.admin_command == "users":
        return _users(args, config)
    if args.admin_command == "sessions":
        return _sessions(args, config)
    if args.admin_command == "queue":
        return _queue(args, config)
    from mdeci.broker.admin import call

    if args.admin_command == "drain":
        answer = call(config.admin_socket, {"op": "drain"})
        ended = answer.get("ended")
        if not isinstance(ended, int):
            raise ConfigError("the broker answered a drain without a count")
        print(f"draining {config.node}: ended {ended} session{'' if ended == 1 else 's'}")
        return 0
    uri = _uri(config, args.uri)
    call(config.admin_socket, {"op": "kick", "uri": uri})
    print(f"kicked {uri}")
    return 0


COMMANDS = {"admin": Command("admin", add_arguments, run)}
