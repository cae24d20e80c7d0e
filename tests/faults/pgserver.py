"""A PostgreSQL server of the test's own, on a free loopback port, that the test restarts.

The shared server on 5432 serves every other test run on the machine: restarting it would
break them. This one is a fresh cluster (``initdb``) in a temporary folder owned by the
``postgres`` user (the server refuses to run as root), started and stopped with
``pg_ctl`` through ``runuser``. :meth:`PgServer.close` stops it (immediate mode) and
removes the folder, whatever state the test left it in.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.peers import free_port, missing

BIN = Path(os.environ.get("MDECI_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
INSTALL = "apt-get install -y postgresql-15 (initdb and pg_ctl in /usr/lib/postgresql/15/bin)"
GUARD = 60  # seconds: initdb, start and stop each take well under that


class PgServer:
    """``initdb`` + ``pg_ctl`` as ``postgres``; :attr:`url` is its SQLAlchemy URL."""

    def __init__(self) -> None:
        for tool in ("initdb", "pg_ctl", "postgres"):
            if not os.access(BIN / tool, os.X_OK):
                missing(f"PostgreSQL server binaries ({BIN / tool})", INSTALL)
        try:
            self.owner = pwd.getpwnam("postgres")
        except KeyError:
            missing("the postgres system user", INSTALL)
        self._as_owner: list[str] = []
        if os.geteuid() == 0:
            runuser = shutil.which("runuser")
            if runuser is None:
                missing(
                    "runuser (to run postgres as its own user)", "apt-get install -y util-linux"
                )
            self._as_owner = [runuser, "-u", "postgres", "--"]
        elif os.geteuid() != self.owner.pw_uid:
            missing("a PostgreSQL server of our own", "run the tests as root or as postgres")
        self.root = Path(tempfile.mkdtemp(prefix="mdeci-pg-"))
        os.chown(self.root, self.owner.pw_uid, self.owner.pw_gid)
        self.data = self.root / "data"
        self.log = self.root / "server.log"
        self.port = free_port(socket.SOCK_STREAM)
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *args: str) -> None:
        done = subprocess.run(
            [*self._as_owner, *args], capture_output=True, text=True, timeout=GUARD, check=False
        )
        if done.returncode != 0:
            raise RuntimeError(f"{Path(args[0]).name}: {done.stderr.strip() or done.stdout}")

    def _pg_ctl(self, *args: str) -> None:
        self._run(str(BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", *args)

    def start(self) -> PgServer:
        """A fresh cluster (trust authentication, loopback only), started. ``-N``: the
        cluster is not fsync-ed; it lives for one test, and a crash loses nothing of value."""
        self._run(str(BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N")
        # Only TCP on loopback; the socket folder is ours (the default one is the shared
        # server's, and may not exist).
        self.resume()
        return self

    def stop(self) -> None:
        """``pg_ctl stop -m fast``: every connection is closed, as for a minor upgrade;
        the server stays down until :meth:`resume`."""
        self._pg_ctl("-m", "fast", "stop")

    def resume(self) -> None:
        """Start the (stopped) server again on the same port and data."""
        options = f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.root} -c fsync=off"
        self._pg_ctl("-o", options, "start")

    def log_text(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace")
        return ""

    def close(self) -> None:
        """Stop the server if it runs and remove its folder."""
        if (self.data / "postmaster.pid").exists():
            with contextlib.suppress(RuntimeError, OSError, subprocess.SubprocessError):
                self._pg_ctl("-m", "immediate", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
