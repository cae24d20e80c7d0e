"""Where an application stands in its notifications: the application-level ack.

The agent keeps the newest notifications in its inbox and replays them on request
(``{"op": "tail", "from": N}``). A cursor remembers the last one the application finished
with, durably, so that after a crash it asks for the next one: nothing lost, and nothing
handed over twice as long as the effect of a notification is saved with its ack (the
``state`` the cursor carries). Numbers belong to one broker store: a cursor of another
store starts again at that store's first notification.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mdeci.client.errors import CursorError
from mdeci.files import write_atomically


@dataclass(frozen=True, slots=True)
class Position:
    """The last notification acknowledged: its store and ``nseq`` (0: none yet)."""

    store: str
    nseq: int


class FileCursor:
    """A cursor in one JSON file, replaced atomically (tmp, fsync, rename, fsync dir).

    ``state`` is the application's own JSON value saved with each ack, in the same write:
    a crash leaves either the old ack and state or the new ones.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        self.position: Position | None = None
        self.state: Any = None
        try:
            raw = self.path.read_text()
        except FileNotFoundError:
            return
        except OSError as exc:
            raise CursorError(f"cannot read {self.path}: {exc.strerror}") from None
        try:
            data = json.loads(raw)
            self.position = Position(str(data["store"]), int(data["nseq"]))
            self.state = data.get("state")
        except (ValueError, TypeError, KeyError) as exc:
            raise CursorError(f"{self.path} is not a cursor file: {exc}") from None

    def save(self, position: Position, state: Any = None) -> None:
        """Record ``position`` and ``state`` durably. Raises :class:`CursorError`."""
        body = json.dumps({"store": position.store, "nseq": position.nseq, "state": state})
        try:
            write_atomically(self.path, body.encode())
        except OSError as exc:
            raise CursorError(f"cannot write {self.path}: {exc.strerror}") from None
        self.position = position
        self.state = state
