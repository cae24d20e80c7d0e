"""The agent's durable state in ``state_dir``: delivered nseq, inbox and outgoing buffer.

Theory of operation
-------------------
Three files, none of them SQL (only ``mdeci/store`` speaks SQL):

- ``inbox.jsonl``: the notifications handed to the applications, one JSON object per
  line. It is the durable record of what was handed over: the records of one burst (all
  the notifications the glue got in one loop turn) are appended with one write and one
  ``fsync`` *before* the agent sends ``ack``, so a notification handed to the
  applications is never handed over again, whatever crashes. ``tail`` reads it, so an
  application that was not listening still finds what arrived. It keeps the newest
  ``inbox_keep`` records (compacted when opened; the newest is always kept).
- ``nseq.json``: ``{"highest": N, "recent": [...], "store": id}``, the state of the
  :class:`~mdeci.sms.dedupe.NseqGate` and the broker store it belongs to. Replaced
  atomically (write a temporary file, ``fsync``, ``rename``, ``fsync`` the folder). With
  a window (SMS) it is saved after every burst, since ``recent`` is not derivable; with
  window 0 the gate is just its highest, which the inbox already holds durably, so it is a
  checkpoint: saved when the store changes and when the agent stops. Opening takes the
  higher of ``highest`` and the inbox's last ``nseq`` (a crash after an inbox append
  leaves the inbox ahead).
- ``outbox.jsonl``: publishes not yet acknowledged by ``pub-ok``: ``{"add": {...}}`` when
  an application publishes, ``{"done": msg_id}`` when the broker accepted it. An ``add``
  is ``fsync``-ed (once for the publishes of a loop turn, :meth:`Outbox.sync`) before the
  publish is sent and the application answered; a ``done`` is
  written without ``fsync``: losing it in a power cut only sends the publish again with
  its ``msg_id``, which the broker takes once (docs/protocol.md). Opening replays the
  lines, drops a torn last line and rewrites the file with only the pending publishes.

Every ``fsync`` goes through the ``fsync`` callable handed to the classes (``os.fsync``
by default), so tests count them per burst.

The files hold the user's notifications and publishes: each is 0600 in a 0700
``state_dir`` (:func:`make_state_dir`), whatever the umask, and a file or folder left
wider by an earlier run is narrowed when opened.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from mdeci.agent.errors import AgentError, StateError
from mdeci.agent.files import KnownSub, OutgoingPub
from mdeci.sms.dedupe import NseqGate

NSEQ_FILE = "nseq.json"
INBOX_FILE = "inbox.jsonl"
OUTBOX_FILE = "outbox.jsonl"
SUBS_FILE = "subs.json"
LOCK_FILE = "lock"

#: Makes a file descriptor's data durable (``os.fsync``; tests hand in a counting one).
Fsync = Callable[[int], None]


def _fsync_dir(folder: Path, fsync: Fsync) -> None:
    with contextlib.suppress(OSError):  # some filesystems refuse fsync on a directory
        fd = os.open(folder, os.O_RDONLY)
        try:
            fsync(fd)
        finally:
            os.close(fd)


def make_state_dir(folder: Path) -> None:
    """Create ``folder`` (and its parents) if missing; make it 0700. Raises
    :class:`StateError`."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(folder, 0o700)  # mkdir's mode is cut by the umask; an old folder stays
    except OSError as exc:
        raise StateError(f"cannot create {folder}: {exc.strerror}") from exc


def _open_private(path: Path, flags: int) -> int:
    """``os.open`` of a file that is 0600 whatever the umask (and an existing one too).
    Raises :class:`OSError`."""
    fd = os.open(path, flags | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    except OSError:
        os.close(fd)
        raise
    return fd


def write_atomic(path: Path, data: bytes, fsync: Fsync = os.fsync) -> None:
    """Replace ``path`` with ``data`` (0600): temporary file, fsync, rename, fsync the
    folder.

    Raises :class:`StateError` when the file cannot be written.
    """
    tmp = path.with_name(path.name + ".tmp")
    try:
        with open(_open_private(tmp, os.O_WRONLY | os.O_TRUNC), "wb") as fh:
            fh.write(data)
            fh.flush()
            fsync(fh.fileno())
        os.replace(tmp, path)
    except OSError as exc:
        raise StateError(f"cannot write {path}: {exc.strerror}") from exc
    _fsync_dir(path.parent, fsync)


def _read_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a JSON-lines file; a torn or invalid line is skipped."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise StateError(f"cannot read {path}: {exc.strerror}") from exc
    out: list[dict[str, Any]] = []
    for line in raw.split(b"\n"):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except (ValueError, UnicodeDecodeError):
            continue  # a torn last line after a crash
        if isinstance(obj, dict):
            out.append(obj)
    return out


def _line(obj: Mapping[str, Any]) -> bytes:
    return (json.dumps(obj, separators=(",", ":"), ensure_ascii=False) + "\n").encode("utf-8")


class _Appender:
    """An append-only file of JSON lines; :meth:`extend` writes several with one write
    and (with ``sync``) one fsync before it returns. Unbuffered: a write the disk refused
    leaves nothing in a buffer to be written again, ahead of the next, once it has space."""

    def __init__(self, path: Path, fsync: Fsync) -> None:
        self.path = path
        self._fsync = fsync
        try:
            fd = _open_private(path, os.O_WRONLY | os.O_APPEND)
            self._fh = open(fd, "ab", buffering=0)  # noqa: SIM115 - kept open for the agent's life
        except OSError as exc:
            raise StateError(f"cannot open {path}: {exc.strerror}") from exc

    def extend(self, objs: Iterable[Mapping[str, Any]], *, sync: bool = True) -> None:
        """Raises :class:`StateError`; then the lines are taken back (best effort), so
        that a burst taken again later is not in the file twice."""
        try:
            end = os.fstat(self._fh.fileno()).st_size  # where a failed write is cut back to
        except (OSError, ValueError) as exc:
            raise StateError(f"cannot append to {self.path}: {exc}") from exc
        try:
            data = memoryview(b"".join(_line(o) for o in objs))
            while data:  # in the OS's hands: a crash of this process keeps it
                data = data[self._fh.write(data) :]
            if sync:
                self._fsync(self._fh.fileno())
        except (OSError, ValueError) as exc:
            with contextlib.suppress(OSError, ValueError):
                self._fh.truncate(end)
            raise StateError(f"cannot append to {self.path}: {exc}") from exc

    def sync(self) -> None:
        """fsync what was written. Raises :class:`StateError`."""
        try:
            self._fsync(self._fh.fileno())
        except (OSError, ValueError) as exc:
            raise StateError(f"cannot sync {self.path}: {exc}") from exc

    def close(self) -> None:
        self._fh.close()


def _rewrite(path: Path, objs: list[dict[str, Any]], fsync: Fsync) -> None:
    write_atomic(path, b"".join(_line(o) for o in objs), fsync)


# ------------------------------------------------------------------ delivered nseq


class NseqState:
    """The exactly-once gate and its file (``nseq.json``)."""

    def __init__(self, path: Path, floor: int = 0, fsync: Fsync = os.fsync) -> None:
        self.path = path
        self._fsync = fsync
        highest, recent = 0, []
        # The broker store incarnation these numbers belong to (None: not known yet).
        self.store_id: str | None = None
        if path.exists():
            try:
                data = json.loads(path.read_bytes())
                highest = int(data["highest"])
                recent = [int(n) for n in data.get("recent", [])]
                store = data.get("store")
                self.store_id = str(store) if store is not None else None
            except (OSError, ValueError, KeyError, TypeError) as exc:
                raise StateError(f"{path} is unreadable: {exc}") from exc
        self.gate = NseqGate(max(highest, floor), recent=recent)
        # What the file holds (None: no file), so that an unchanged gate is not written
        # again (a stop right after a checkpoint, a burst of duplicates).
        self._saved: tuple[int, tuple[int, ...], str | None] | None = (
            (highest, tuple(recent), self.store_id) if path.exists() else None
        )

    @property
    def highest(self) -> int:
        """The highest ``nseq`` handed to the applications."""
        return self.gate.highest

    @property
    def per_burst(self) -> bool:
        """Whether the gate must be saved with every burst of notifications: only a
        windowed gate has ``recent`` numbers the inbox does not give back."""
        return self.gate.window > 0

    def save(self) -> None:
        """Persist the gate atomically (not again if unchanged). Raises :class:`StateError`."""
        now = (self.gate.highest, self.gate.recent, self.store_id)
        if now == self._saved:
            return
        data: dict[str, Any] = {"highest": self.gate.highest, "recent": list(self.gate.recent)}
        if self.store_id is not None:
            data["store"] = self.store_id
        write_atomic(self.path, json.dumps(data).encode(), self._fsync)
        self._saved = now

    def restart(self, store_id: str, window: int = 0) -> None:
        """A new broker store numbers from 1 again: an empty gate for ``store_id``, saved.

        Raises :class:`StateError`.
        """
        self.gate = NseqGate(0, window=window)
        self.store_id = store_id
        self.save()


# ------------------------------------------------------------------ inbox


class Inbox:
    """Notifications handed to the applications (newest ``keep`` kept)."""

    def __init__(self, path: Path, keep: int = 1000, fsync: Fsync = os.fsync) -> None:
        # The newest record holds the gate's highest (nseq.json is a checkpoint): kept.
        keep = max(1, keep)
        records = [r for r in _read_lines(path) if isinstance(r.get("nseq"), int)]
        if len(records) > keep:
            # The highest is kept too, wherever it is (SMS may hand over out of order).
            top = max(records, key=lambda r: int(r["nseq"]))
            records = records[-keep:]
            if top not in records:
                records.insert(0, top)
            _rewrite(path, records, fsync)
        self.records = records
        self.keep = keep
        self._fsync = fsync
        self._file = _Appender(path, fsync)

    @property
    def last_nseq(self) -> int:
        return max((int(r["nseq"]) for r in self.records), default=0)

    def append(self, record: dict[str, Any]) -> None:
        """Append one notification and fsync it. Raises :class:`StateError`."""
        self.extend([record])

    def extend(self, records: list[dict[str, Any]]) -> None:
        """Append a burst of notifications with one write and one fsync.

        Raises :class:`StateError` (then none of them counts as recorded).
        """
        self._file.extend(records)
        self.records.extend(records)
        if len(self.records) > 2 * self.keep:
            del self.records[: -self.keep]

    def archive(self, suffix: str) -> Path:
        """Move the kept notifications to ``inbox.<suffix>.jsonl`` and start empty.

        Used when the broker store was replaced: its ``nseq`` numbers start over, and the
        old ones must neither raise the new gate's floor nor mix with new ones in ``tail``.
        Raises :class:`StateError`.
        """
        self._file.close()
        path = self._file.path
        target = path.with_name(f"{path.stem}.{suffix}{path.suffix}")
        try:
            os.replace(path, target)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise StateError(f"cannot archive {path}: {exc.strerror}") from exc
        self.records = []
        self._file = _Appender(path, self._fsync)
        return target

    def since(self, nseq: int) -> list[dict[str, Any]]:
        """Kept notifications with ``nseq >= nseq``, oldest first."""
        return [r for r in self.records if int(r["nseq"]) >= nseq]

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------------ outbox


class Outbox:
    """Publishes waiting for ``pub-ok``, durable across crashes (``outbox.jsonl``)."""

    def __init__(self, path: Path, fsync: Fsync = os.fsync) -> None:
        pending: dict[str, OutgoingPub] = {}
        for obj in _read_lines(path):
            if isinstance(obj.get("add"), dict):
                try:
                    pub = OutgoingPub.from_json(obj["add"])
                except (KeyError, TypeError, ValueError):
                    continue
                pending[pub.msg_id] = pub
            elif isinstance(obj.get("done"), str):
                pending.pop(obj["done"], None)
        _rewrite(path, [{"add": p.to_json()} for p in pending.values()], fsync)
        self.path = path
        self._pending = pending
        self._file = _Appender(path, fsync)
        self._unsynced = False  # an add written and not fsync-ed yet

    def add(self, pub: OutgoingPub, *, sync: bool = True) -> None:
        """Record a publish before it is sent: durably, or (``sync`` False) written now
        and made durable by :meth:`sync`, once for several. Raises :class:`StateError`."""
        self._file.extend([{"add": pub.to_json()}], sync=sync)
        self._unsynced = self._unsynced or not sync
        self._pending[pub.msg_id] = pub

    def sync(self) -> None:
        """fsync what :meth:`add` wrote without (nothing if nothing). Raises
        :class:`StateError`."""
        if self._unsynced:
            self._file.sync()
            self._unsynced = False

    def done(self, msg_id: str) -> None:
        """The broker acknowledged ``msg_id`` (idempotent). Raises :class:`StateError`.

        Not fsync-ed: a ``done`` lost in a power cut only sends the publish again with its
        ``msg_id``, which the broker dedupes; the next fsync of the file carries it anyway.
        """
        if msg_id in self._pending:
            self._file.extend([{"done": msg_id}], sync=False)
            del self._pending[msg_id]

    def pending(self) -> list[OutgoingPub]:
        """Unacknowledged publishes, oldest first."""
        return list(self._pending.values())

    def __contains__(self, msg_id: object) -> bool:
        return msg_id in self._pending

    def __len__(self) -> int:
        return len(self._pending)

    def close(self) -> None:
        self._file.close()


# ------------------------------------------------------------------ subscriptions


class SubsRecord:
    """The agent's own record of its subscriptions (``subs.json``, replaced atomically)."""

    def __init__(self, path: Path, fsync: Fsync = os.fsync) -> None:
        self.path = path
        self._fsync = fsync
        items: list[KnownSub] = []
        try:
            data = json.loads(path.read_bytes())
            for obj in data:
                items.append(
                    KnownSub(
                        sub_id=str(obj["sub_id"]),
                        subject=str(obj["subject"]),
                        filter=str(obj.get("filter", "")),
                        expires_at=float(obj["expires_at"]),
                        qclass=str(obj.get("qclass", "")),
                        in_order=bool(obj.get("in_order", False)),
                        ttl=None if obj.get("ttl") is None else int(obj["ttl"]),
                        lease=bool(obj.get("lease", True)),
                    )
                )
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateError(f"{path} is unreadable: {exc}") from exc
        self.items: tuple[KnownSub, ...] = tuple(items)

    def replace(self, items: tuple[KnownSub, ...]) -> None:
        """Remember ``items``. Raises :class:`StateError`."""
        if items == self.items:
            return
        data = [
            {
                "sub_id": s.sub_id,
                "subject": s.subject,
                "filter": s.filter,
                "expires_at": s.expires_at,
                "qclass": s.qclass,
                "in_order": s.in_order,
                "ttl": s.ttl,
                "lease": s.lease,
            }
            for s in items
        ]
        write_atomic(self.path, json.dumps(data).encode(), self._fsync)
        self.items = items


# ------------------------------------------------------------------ the folder


@dataclass(frozen=True, slots=True, kw_only=True)
class StateFiles:
    """The state files of one ``state_dir`` (an :class:`~mdeci.agent.files.AgentFiles`)."""

    inbox: Inbox
    nseq: NseqState
    outbox: Outbox
    subs: SubsRecord

    def close(self) -> None:
        self.inbox.close()
        self.outbox.close()


def open_state_files(state_dir: Path, fsync: Fsync = os.fsync) -> StateFiles:
    """Open (and compact) the state files of ``state_dir``. Raises :class:`StateError`."""
    inbox = Inbox(state_dir / INBOX_FILE, fsync=fsync)
    return StateFiles(
        inbox=inbox,
        nseq=NseqState(state_dir / NSEQ_FILE, floor=inbox.last_nseq, fsync=fsync),
        outbox=Outbox(state_dir / OUTBOX_FILE, fsync=fsync),
        subs=SubsRecord(state_dir / SUBS_FILE, fsync=fsync),
    )


def lock_state_dir(state_dir: Path) -> IO[bytes]:
    """Take ``state_dir/lock`` (an exclusive flock, released when the process ends).

    Raises :class:`AgentError` when another agent holds it: that agent's socket and files
    are left alone.
    """
    path = state_dir / LOCK_FILE
    try:
        fh = open(_open_private(path, os.O_RDWR | os.O_APPEND), "a+b")  # noqa: SIM115 - held for the agent's life
    except OSError as exc:
        raise StateError(f"cannot open {path}: {exc.strerror}") from exc
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        holder = fh.read().decode("ascii", "replace").strip() or "?"
        fh.close()
        raise AgentError(
            f"another agent (pid {holder}) is using {state_dir}: "
            "stop it first, or give this one its own state_dir"
        ) from None
    fh.seek(0)
    fh.truncate()
    fh.write(str(os.getpid()).encode())
    fh.flush()
    return fh


__all__ = [
    "INBOX_FILE",
    "LOCK_FILE",
    "NSEQ_FILE",
    "OUTBOX_FILE",
    "SUBS_FILE",
    "Fsync",
    "Inbox",
    "KnownSub",
    "NseqState",
    "Outbox",
    "OutgoingPub",
    "StateFiles",
    "SubsRecord",
    "lock_state_dir",
    "make_state_dir",
    "open_state_files",
    "write_atomic",
]
