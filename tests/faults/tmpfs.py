"""A small tmpfs of the test's own: a disk that fills up after a few megabytes.

Mounting needs root (CAP_SYS_ADMIN); without it the test skips (fails under CI) with the
way to run it. :meth:`Tmpfs.close` unmounts it (lazily if something still holds it open)
and removes the mount point, whatever state the test left it in.
"""

from __future__ import annotations

import contextlib
import subprocess
import tempfile
from pathlib import Path

from tests.peers import missing, require_binary

GUARD = 30  # seconds for mount and umount


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=GUARD, check=False)


class Tmpfs:
    """``mount -t tmpfs -o size=<size> tmpfs <path>`` on a fresh folder."""

    def __init__(self, size: str) -> None:
        mount = require_binary("mount", "apt-get install -y mount")
        self.umount = require_binary("umount", "apt-get install -y mount")
        self.path = Path(tempfile.mkdtemp(prefix="mdeci-tmpfs-"))
        done = _run(mount, "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(self.path))
        if done.returncode != 0:
            self.path.rmdir()
            missing(
                f"a tmpfs mount ({done.stderr.strip()})",
                "run the tests as root (or with CAP_SYS_ADMIN) to mount a small tmpfs",
            )

    def close(self) -> None:
        if _run(self.umount, str(self.path)).returncode != 0:
            _run(self.umount, "-l", str(self.path))  # a process we failed to stop holds it
        with contextlib.suppress(OSError):
            self.path.rmdir()
