"""Durable whole-file replacement: a reader finds the old content or the new one, never a
torn mix, and once the call returns a crash keeps the new one."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: bytes, *, fsync: bool = True, private: bool = False) -> None:
    """Replace ``path`` with ``data``: write a temporary file beside it, fsync it, rename it
    over ``path``, fsync the folder (the rename is durable only once the folder is).

    ``fsync=False`` skips both fsyncs (tests, throwaway state). ``private`` makes a missing
    folder 0700 and the file 0600. Raises :class:`OSError`.
    """
    tmp = path.with_name(path.name + ".tmp")
    if private:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o666)
    with open(fd, "wb") as out:
        out.write(data)
        if fsync:
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, path)
    if fsync:
        folder = os.open(path.parent, os.O_RDONLY)
        try:
            os.fsync(folder)
        finally:
            os.close(folder)
