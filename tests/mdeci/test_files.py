"""write_atomically: whole-file replacement, private modes."""

from __future__ import annotations

import stat
from pathlib import Path

from mdeci.files import write_atomically


def test_write_atomically_replaces_the_content_and_leaves_no_temporary(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "state.json"
    write_atomically(path, b"old")
    write_atomically(path, b"new")
    assert path.read_bytes() == b"new"
    assert sorted(p.name for p in path.parent.iterdir()) == ["state.json"]


def test_write_atomically_private_makes_the_folder_0700_and_the_file_0600(tmp_path: Path) -> None:
    path = tmp_path / "private" / "counters.json"
    write_atomically(path, b"{}", fsync=False, private=True)
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
