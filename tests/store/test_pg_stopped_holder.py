"""A process stopped (SIGSTOP) inside a PostgreSQL transaction, as a frozen broker is:
the server ends its session after ``PG_IDLE_IN_TRANSACTION_TIMEOUT_MS`` and the row lock
it held is free for another broker's takeover; the stopped process, continued, finds its
connection gone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import Engine

from mdeci.store.base import PG_IDLE_IN_TRANSACTION_TIMEOUT_MS
from tests.peers import missing

TABLE = "mdeci_stopped_holder_probe"

# The holder: our engine (make_engine's options), a row lock, then it waits to be stopped.
HOLDER = f"""
import sys
from sqlalchemy import text
from mdeci.store.base import make_engine
engine = make_engine(sys.argv[1])
conn = engine.connect()
conn.execute(text("SELECT id FROM {TABLE} WHERE id = 1 FOR UPDATE"))
print("locked", flush=True)
sys.stdin.readline()  # stopped here; continued, it tries its transaction again
try:
    conn.execute(text("SELECT 1"))
    print("still open", flush=True)
except Exception as exc:
    print("gone", type(exc).__name__, flush=True)
"""


@pytest.fixture
def pg() -> Iterator[tuple[str, Engine]]:
    url = os.environ.get("MDECI_TEST_PG_URL")
    if not url:
        missing("PostgreSQL", "export MDECI_TEST_PG_URL=postgresql+psycopg://...")
    # The waiting side: a plain engine, no statement timeout of ours, so what frees the
    # lock can only be the server ending the stopped holder's session.
    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {TABLE}"))
        conn.execute(text(f"CREATE TABLE {TABLE} (id integer PRIMARY KEY)"))
        conn.execute(text(f"INSERT INTO {TABLE} VALUES (1)"))
    try:
        yield url, engine
    finally:
        with engine.begin() as conn:
            conn.execute(text(f"DROP TABLE IF EXISTS {TABLE}"))
        engine.dispose()


def test_a_stopped_holder_loses_its_lock_after_the_idle_transaction_timeout(
    pg: tuple[str, Engine],
) -> None:
    url, engine = pg
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, url],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        assert holder.stdout.readline().strip() == "locked"
        os.kill(holder.pid, signal.SIGSTOP)
        start = time.monotonic()
        with engine.begin() as conn:
            conn.execute(text("SET LOCAL statement_timeout = '60s'"))
            got = conn.execute(text(f"SELECT id FROM {TABLE} WHERE id = 1 FOR UPDATE"))
            assert got.scalar() == 1
        waited = time.monotonic() - start
        bound = PG_IDLE_IN_TRANSACTION_TIMEOUT_MS / 1000
        assert bound * 0.5 <= waited <= bound + 10, waited
        os.kill(holder.pid, signal.SIGCONT)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().split()[0] == "gone"
        assert holder.wait(timeout=30) == 0
    finally:
        if holder.poll() is None:
            os.kill(holder.pid, signal.SIGCONT)
            holder.kill()
            holder.wait(timeout=30)
