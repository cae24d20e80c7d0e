"""Engines for the store tests: a fresh SQLite file, and PostgreSQL when configured.

The schema comes from ``alembic upgrade head`` (so repositories are tested against the
migrated schema, not ``create_all``), built once per session: SQLite copies a template
file per test; PostgreSQL uses a schema of its own (``search_path``), emptied per test,
so tests running beside other people's on the shared ``test`` database touch nothing
of theirs.
"""

from __future__ import annotations

import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from sqlalchemy.engine import Engine

from mdeci.store.base import Base, import_all_models, make_engine
from tests.peers import pg_url

ROOT = Path(__file__).resolve().parents[2]
BROKER_TABLES = (
    "users",
    "bindings",
    "sessions",
    "subscriptions",
    "published_messages",
    "queue_counters",
    "queued_notifications",
)


def _upgrade(url: str) -> None:
    cfg = Config(str(ROOT / "alembic.ini"))
    cfg.attributes["url"] = url
    command.upgrade(cfg, "head")


@pytest.fixture(scope="session")
def sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("store") / "template.db"
    _upgrade(f"sqlite:///{path}")
    return path


@pytest.fixture(scope="session")
def pg_schema_url() -> Iterator[str]:
    url = pg_url()
    schema = f"store_{uuid.uuid4().hex[:12]}"
    admin = make_engine(url)
    with admin.begin() as conn:
        conn.execute(sa.text(f'CREATE SCHEMA "{schema}"'))
    sep = "&" if "?" in url else "?"
    try:
        scoped = f"{url}{sep}options=-csearch_path%3D{schema}"
        _upgrade(scoped)
        yield scoped
    finally:
        with admin.begin() as conn:
            conn.execute(sa.text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()


@pytest.fixture
def sqlite_path(sqlite_template: Path, tmp_path: Path) -> Path:
    """A fresh, migrated SQLite database file."""
    path = tmp_path / "broker.db"
    shutil.copyfile(sqlite_template, path)
    return path


@pytest.fixture(params=["sqlite", "postgresql"])
def engine(request: pytest.FixtureRequest) -> Iterator[Engine]:
    """An engine on an empty, migrated database: SQLite, then PostgreSQL if configured."""
    if request.param == "sqlite":
        path: Path = request.getfixturevalue("sqlite_path")
        eng = make_engine(f"sqlite:///{path}")
    else:
        url: str = request.getfixturevalue("pg_schema_url")
        eng = make_engine(url)
        import_all_models()
        assert set(BROKER_TABLES) <= set(Base.metadata.tables)
        with eng.begin() as conn:
            conn.execute(sa.text(f"TRUNCATE {', '.join(BROKER_TABLES)} RESTART IDENTITY"))
    try:
        yield eng
    finally:
        eng.dispose()
