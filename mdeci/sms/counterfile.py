"""The SMS replay counters in one JSON file: a :class:`~mdeci.sms.auth.CounterStore`.

The agent keeps it in its ``state_dir``, the broker in its ``data_dir``
(:data:`COUNTER_FILE`), private (0600; the folder is made 0700 if missing). Every ``save``
rewrites the file atomically (a temporary file,
fsync, rename, fsync of the folder) before it returns, so an SMS never leaves with a
counter the file does not cover and an accepted counter survives a crash. SMS go out a
few a second at most, so one small write each is cheap. The codec never touches it.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any, TypeVar

from mdeci.files import write_atomically
from mdeci.sms.auth import PeerCounters
from mdeci.sms.errors import CounterFileError

COUNTER_FILE = "sms-counters.json"
VERSION = 1
T = TypeVar("T")


def parse_counters(data: bytes) -> dict[str, PeerCounters]:
    """The peers of a counter file's bytes; raises :class:`CounterFileError` if malformed."""
    try:
        doc: Any = json.loads(data)
        if not isinstance(doc, dict) or doc.get("v") != VERSION:
            raise CounterFileError("not an SMS counter file of version 1")
        peers = doc["peers"]
        if not isinstance(peers, dict):
            raise CounterFileError("peers is not an object")
        out = {}
        for number, rec in peers.items():
            counters = PeerCounters(
                key_id=_typed(rec["key_id"], str),
                send_next=_typed(rec["send_next"], int),
                recv_highest=_typed(rec["recv_highest"], int),
                recv_recent=tuple(_typed(n, int) for n in rec["recv_recent"]),
            )
            out[_typed(number, str)] = counters
        return out
    except CounterFileError:
        raise
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise CounterFileError(f"malformed SMS counter file: {exc!r}") from None


def _typed(value: object, kind: type[T]) -> T:
    if not isinstance(value, kind) or isinstance(value, bool):
        raise CounterFileError(f"{value!r} is not {kind.__name__}")
    return value


def dump_counters(peers: dict[str, PeerCounters]) -> bytes:
    doc = {"v": VERSION, "peers": {n: asdict(c) for n, c in sorted(peers.items())}}
    return json.dumps(doc, separators=(",", ":")).encode()


class JsonCounters:
    """The counters of every peer in the file at ``path`` (read once, rewritten per save).

    Raises :class:`CounterFileError` if the file exists and is malformed: replay
    protection is not silently dropped.
    """

    def __init__(self, path: Path, *, fsync: bool = True) -> None:
        self.path = path
        self._fsync = fsync
        try:
            self._peers = parse_counters(path.read_bytes())
        except FileNotFoundError:
            self._peers = {}
        except OSError as exc:
            raise CounterFileError(f"cannot read {path}: {exc.strerror}") from None

    def load(self, peer: str) -> PeerCounters | None:
        return self._peers.get(peer)

    def save(self, peer: str, counters: PeerCounters) -> None:
        """Raises :class:`CounterFileError` if the file cannot be written."""
        self._peers[peer] = counters
        try:
            write_atomically(self.path, dump_counters(self._peers), fsync=self._fsync, private=True)
        except OSError as exc:
            raise CounterFileError(f"cannot write {self.path}: {exc.strerror}") from None
