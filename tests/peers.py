"""Real peers the tests talk to, and the one rule for when one is missing.

Without CI=true a missing peer skips the test with a message saying how to install it;
with CI=true (set by .ci/run) the same test fails, so nothing is silently skipped in CI.
"""

from __future__ import annotations

import os
import shutil
import socket
from pathlib import Path
from typing import NoReturn

import pytest

ROOT = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() in {"1", "true", "yes"}


def missing(what: str, how: str) -> NoReturn:
    """Skip (or, in CI, fail) because a peer is missing; ``how`` says how to install it."""
    message = f"{what} is not available; install it with: {how}"
    if IN_CI:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def require_binary(name: str, how: str) -> str:
    """Path of an executable, or skip/fail with the install hint."""
    path = shutil.which(name) or next(
        (
            p
            for p in (f"/usr/sbin/{name}", f"/usr/bin/{name}", f"/usr/local/bin/{name}")
            if os.access(p, os.X_OK)
        ),
        None,
    )
    if path is None:
        missing(name, how)
    return path


def require_tcp(host: str, port: int, what: str, how: str) -> None:
    """Skip/fail unless something accepts TCP connections at host:port."""
    try:
        with socket.create_connection((host, port), timeout=1.0):
            return
    except OSError:
        missing(f"{what} at {host}:{port}", how)


def pg_url() -> str:
    """The PostgreSQL URL for store tests (MDECI_TEST_PG_URL), or skip/fail."""
    url = os.environ.get("MDECI_TEST_PG_URL")
    if not url:
        missing(
            "PostgreSQL (MDECI_TEST_PG_URL)",
            "export MDECI_TEST_PG_URL=postgresql+psycopg://postgres@127.0.0.1:5432/test",
        )
    return url


def free_port(kind: int = socket.SOCK_DGRAM, host: str = "127.0.0.1") -> int:
    """A port the kernel just handed out on ``host`` for ``kind`` (UDP by default) that is
    free for the other of UDP and TCP too: SIP peers (Kamailio, sipp) listen on both."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    other = socket.SOCK_STREAM if kind == socket.SOCK_DGRAM else socket.SOCK_DGRAM
    for _ in range(50):
        with socket.socket(family, kind) as s:
            s.bind((host, 0))
            port = int(s.getsockname()[1])
            with socket.socket(family, other) as t:
                try:
                    t.bind((host, port))
                except OSError:
                    continue
                return port
    raise OSError(f"no port free for both UDP and TCP on {host}")


def require_netns() -> None:
    """Skip/fail unless this process may create network namespaces (root, iproute2)."""
    import subprocess

    probe = f"mdeci-probe-{os.getpid()}"
    try:
        for args in (["ip", "netns", "add", probe], ["ip", "netns", "del", probe]):
            done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
            if done.returncode != 0:
                raise RuntimeError(done.stderr.strip())
    except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
        missing(
            f"network namespaces ({exc})",
            "run as root (or with CAP_NET_ADMIN and CAP_SYS_ADMIN) with iproute2: "
            "apt-get install -y iproute2",
        )


def conformance(name: str) -> Path:
    """A directory of the shared conformance data (``../shared/conformance`` beside the
    checkout, or ``$MDECI_CONFORMANCE``), or skip/fail."""
    root = Path(os.environ.get("MDECI_CONFORMANCE", ROOT.parent / "shared" / "conformance"))
    if not (root / name).is_dir():
        missing(
            f"the conformance corpus {root / name}",
            "check the shared data out beside this one, or export MDECI_CONFORMANCE=<its path>",
        )
    return root / name
