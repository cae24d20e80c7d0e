"""Usage counters under test: in memory, SQLite file, PostgreSQL (own schema)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config

from mdeci.channels import MemoryUsage, UsageCounter
from mdeci.store.base import make_engine
from mdeci.store.usage import SqlUsage
from tests.peers import pg_url

ROOT = Path(__file__).resolve().parents[2]

#: Opens a counter on the same storage again ("the broker restarted"), or None in memory.
Reopen = Callable[[], UsageCounter]


def migrate(url: str) -> None:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = url
    command.upgrade(cfg, "head")


@pytest.fixture(params=["memory", "sqlite", "postgresql"])
def counter_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Reopen]:
    """A function that opens a fresh counter object over one storage each call."""
    yield from _factory(request.param, tmp_path)


@pytest.fixture(params=["sqlite", "postgresql"])
def sql_factory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Callable[[], SqlUsage]]:
    """Like ``counter_factory``, SQL only."""
    yield from _factory(request.param, tmp_path)  # type: ignore[misc]


def _factory(kind: str, tmp_path: Path) -> Iterator[Reopen]:
    if kind == "memory":
        mem = MemoryUsage()
        yield lambda: mem
        return
    engines: list[sa.engine.Engine] = []
    if kind == "sqlite":
        url = f"sqlite:///{tmp_path / 'usage.db'}"
        cleanup: Callable[[], None] = lambda: None  # noqa: E731
    else:
        base = pg_url()
        schema = f"usage_{tmp_path.name[-20:].replace('-', '_').lower()}"
        admin = make_engine(base)
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
        sep = "&" if "?" in base else "?"
        url = f"{base}{sep}options=-csearch_path%3D{schema}"

        def cleanup() -> None:
            with admin.begin() as conn:
                conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
            admin.dispose()

    migrate(url)

    def reopen() -> SqlUsage:
        # A new engine each time: nothing survives in process memory, only in the DB.
        for old in engines:
            old.dispose()
        engine = make_engine(url)
        engines.append(engine)
        return SqlUsage(engine)

    try:
        yield reopen
    finally:
        for engine in engines:
            engine.dispose()
        cleanup()
